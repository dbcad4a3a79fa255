"""Float32 weights relaid for the CPU's bundled BLAS: same values and outputs, a row-major W.T, shared
weights kept shared, quantized ones left alone, and the bench's baseline run on the stored layout."""

import mlx.core as mx
import mlx.nn as nn
import mlx_spec
from mlx_spec import bench, cpu_layout
from mlx_spec.bench import encode


def strides(a: mx.array) -> tuple[int, ...]:
    return memoryview(a).strides


def test_a_relaid_weight_is_the_transposed_view_of_a_row_major_copy():
    layer = nn.Linear(4, 3)
    before = mx.array(layer.weight)
    assert cpu_layout.relayout(layer) == 1
    assert layer.weight.shape == (3, 4) and mx.array_equal(layer.weight, before)
    assert strides(layer.weight) == (4, 12)  # column-major [out, in]: `weight.T` reads row-major
    cpu_layout.relayout(layer, stored=True)
    assert strides(layer.weight) == (16, 4) and mx.array_equal(layer.weight, before)


def test_a_tied_weight_moves_once_and_stays_shared():
    a, b = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)
    b.weight = a.weight
    assert cpu_layout.relayout(nn.Sequential(a, b)) == 1
    assert a.weight is b.weight


def test_quantized_and_half_weights_stay_as_stored():
    q = nn.QuantizedLinear(64, 32, group_size=32, bits=4)
    half = nn.Linear(4, 4)
    half.set_dtype(mx.float16)
    assert cpu_layout.relayout(nn.Sequential(q, half)) == 0
    assert strides(half.weight) == (8, 2)


def test_the_relaid_pair_decodes_as_the_stored_one(target_dir, drafter_dir):
    """Same logits bit for bit, and the same greedy speculative answer."""
    relaid, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), relayout=True)
    stored, _ = mlx_spec.load(str(target_dir), drafter=str(drafter_dir), relayout=False)
    assert relaid.relaid and not stored.relaid
    head = relaid.model.model.embed_tokens.weight  # tied: the LM head reads it as `x @ W.T`
    assert strides(head)[0] == 4
    assert strides(relaid.drafter.inner.fc.weight)[0] == 4  # the drafter's own weights too
    ids = mx.array([encode(tok, "def add(a, b):\n    return a + b\n\ndef mul(a, b):")])
    assert mx.array_equal(relaid(ids), stored(ids))
    prompt = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    assert (mlx_spec.generate(relaid, tok, prompt, max_tokens=32)
            == mlx_spec.generate(stored, tok, prompt, max_tokens=32))


def test_load_relays_where_it_pays(target_dir, monkeypatch):
    monkeypatch.setattr(cpu_layout, "pays", lambda: False)
    assert not mlx_spec.load(str(target_dir), drafter=None)[0].relaid
    monkeypatch.setattr(cpu_layout, "pays", lambda: True)
    assert mlx_spec.load(str(target_dir), drafter=None)[0].relaid


def test_the_bench_baseline_runs_mlx_lm_on_the_stored_layout(target_dir, monkeypatch):
    model, tok = mlx_spec.load(str(target_dir), drafter=None, relayout=True)
    seen = []

    def stream_generate(m, *args, **kwargs):
        seen.append(strides(m.model.embed_tokens.weight))
        yield from real(m, *args, **kwargs)

    import mlx_lm

    real = mlx_lm.stream_generate
    monkeypatch.setattr(mlx_lm, "stream_generate", stream_generate)
    sample = bench.run_plain(model, tok, encode(tok, "def add(a, b):"), 4)
    assert len(sample.tokens) == 4 and seen == [(4 * model.model.model.embed_tokens.weight.shape[1], 4)]
    assert strides(model.model.model.embed_tokens.weight)[0] == 4  # relaid again afterwards


def test_the_layout_pays_only_on_the_cpu_with_the_bundled_blas(monkeypatch):
    from mlx_spec import platform_blas

    info = platform_blas.BlasInfo([], reference=True, optimized=None)
    monkeypatch.setattr(platform_blas, "blas_info", lambda: info)
    assert cpu_layout.pays() == (mx.default_device() == mx.cpu)
    info.reference = False
    assert not cpu_layout.pays()
