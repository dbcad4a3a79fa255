"""`mlx-spec convert`: a hand-made Hugging Face checkpoint with an MTP head becomes an MLX folder that keeps
the head (mlx-lm's converter drops it), quantized apart from the target, and loads and decodes losslessly
with its drafter; a separate drafter is converted beside it and found through the user registry."""

import json

import mlx.core as mx
import pytest

import factory
import mlx_spec
from mlx_spec.cli import main
from mlx_spec.drafters import model_drafter
from mlx_spec.model_files import safetensors_header
from test_dflash2 import make_dflash2
from drafter_checks import plain
from test_lossless_greedy import spec

mtp_checkpoints = pytest.importorskip("mtp_checkpoints", reason="the MTP test checkpoints (tests/mtp_checkpoints.py)")


@pytest.fixture(autouse=True)
def user_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # the registry file lives here, not in ~
    return tmp_path / "xdg" / "mlx-spec" / "registry.json"


@pytest.fixture(scope="module")
def hf_mtp(models_dir, tokenizer_dir):
    return mtp_checkpoints.qwen35(models_dir / "hf-qwen35-mtp", tokenizer_dir)


def rounds(model, tok, prompt, block):
    return [(r.tokens, r.accepted) for r in mlx_spec.stream_generate(model, tok, prompt, max_tokens=20, block_size=block)]


def test_keeps_mtp_and_drafts_as_the_original(hf_mtp, tmp_path):
    out = tmp_path / "mlx"
    assert main(["convert", str(hf_mtp), "--out", str(out)]) == 0
    names = set(safetensors_header(out / "mtp.safetensors")[0]) - {"__metadata__"}
    assert names and all(n.startswith("mtp.") for n in names)
    model, tok = mlx_spec.load(str(out))  # auto: the converted folder's own MTP head
    assert type(model_drafter(model.drafter)).__name__ == "MTPDrafter"
    original, otok = mlx_spec.load(str(hf_mtp), mode="mtp")
    for prompt in ("def add(a, b):", "Hello, how are you"):
        ref = plain(out, prompt, 20)
        for block in (2, 4):
            got, _ = spec(model, tok, prompt, 20, block_size=block)
            assert got == ref, (prompt, block)
        # The same drafts accepted round by round as the head read from the Hugging Face shards.
        assert rounds(model, tok, prompt, 3) == rounds(original, otok, prompt, 3)


def test_target_and_drafter_quantized_apart(hf_mtp, tmp_path):
    out = tmp_path / "q"
    assert main(["convert", str(hf_mtp), "--out", str(out), "--q-bits", "4", "--drafter-q-bits", "8",
                 "--q-group-size", "32"]) == 0
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 4
    header = safetensors_header(out / "mtp.safetensors")[0]
    fc, scales = header["mtp.fc.weight"]["shape"], header["mtp.fc.scales"]["shape"]
    assert fc[-1] * 32 // (scales[-1] * 32) == 8  # packed int32 columns per group of 32: 8 bits
    model, tok = mlx_spec.load(str(out))
    assert type(model_drafter(model.drafter)).__name__ == "MTPDrafter"
    got, _ = spec(model, tok, "def add(a, b):", 20, block_size=3)
    assert got == plain(out, "def add(a, b):", 20)


def test_separate_drafter_is_registered(target_dir, tmp_path, user_registry):
    drafter = make_dflash2(tmp_path / "hf-dflash2", target_dir, taps=(0, 2), block_size=6)
    out = tmp_path / "pair"
    assert main(["convert", str(target_dir), "--out", str(out), "--q-bits", "8", "--q-group-size", "32",
                 "--drafter", str(drafter), "--drafter-q-bits", "8", "--q-group-size", "32"]) == 0
    pairs = json.loads(user_registry.read_text())["pairs"]
    assert pairs == [{"target": str(out.resolve()), "drafter": str((out / "drafter").resolve()), "kind": "dflash2"}]
    model, tok = mlx_spec.load(str(out))  # auto finds the converted drafter through the user registry
    assert type(model_drafter(model.drafter)).__name__ == "DFlash2Drafter" and model.drafter_path == out / "drafter"
    assert "Quantized" in type(model_drafter(model.drafter).layers[0].mlp.up_proj).__name__
    got, _ = spec(model, tok, "def add(a, b):", 20, block_size=4)
    assert got == plain(out, "def add(a, b):", 20)


def test_float16_target_keeps_a_float32_drafter(target_dir, tmp_path):
    """float16 drafter activations overflow and lose acceptance: the drafter stays float32."""
    drafter = factory.make_drafter(tmp_path / "hf-dflash", target_dir)
    out = tmp_path / "fp16"
    assert main(["convert", str(target_dir), "--out", str(out), "--dtype", "float16", "--drafter", str(drafter)]) == 0
    dtypes = {v["dtype"] for k, v in safetensors_header(out / "drafter" / "model.safetensors")[0].items()
              if k != "__metadata__"}
    assert dtypes == {"F32"}
    model, tok = mlx_spec.load(str(out))
    assert model.model.layers[0].mlp.up_proj.weight.dtype == mx.float16
    ids = tok.encode("def add(a, b):")
    _, hidden = model.target(mx.array([ids]), None)
    drafter = model_drafter(model.drafter)
    state = drafter.make_state()
    drafter.observe(state, hidden, ids)
    assert drafter.block_hidden(state, 5, 4).dtype == mx.float32
    assert main(["convert", str(target_dir), "--out", str(out)]) == 2  # an existing folder is refused
