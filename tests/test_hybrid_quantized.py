"""8-bit and 4-bit targets of every hybrid, sliding-window and MoE family under the one loop, exactly.

Each family's tiny random model is quantized with mlx-lm's `quantize_model` (group 32) and decoded once
with an oracle drafter that gets part of every block wrong, so recurrent states are rewound and replayed
and sliding windows trimmed on quantized weights; the output must equal mlx-lm's plain greedy output of
the same quantized model. One short generation per family and width keeps the default run cheap; the
block sweep is `-m slow`.
"""

import pytest

import archs
import factory
import mlx_spec
from test_hybrid import FAMILIES, NAMES, PROMPT, plain, spec

N = 16


def quantized(models_dir, tokenizer_dir, name, bits):
    src = archs.make(models_dir / f"hy-{name}", tokenizer_dir, name, seed=3)
    target = models_dir / f"hy-{name}-q{bits}"
    if not target.exists():
        factory.quantize(src, target, bits=bits)
    return target


def check(target, block, error_rate=0.3, n=N):
    ref = plain(target, n=n)
    model, tok = mlx_spec.load(str(target), drafter=None)
    assert "Quantized" in str([type(m).__name__ for _, m in model.target.model.named_modules()])
    model.drafter = factory.OracleDrafter(tok.encode(PROMPT) + ref, block, error_rate, seed=block, vocab=300)
    got, last = spec(model, tok, PROMPT, n, block_size=block)
    assert got == ref
    return last.spec


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", NAMES)
def test_quantized_partial_acceptance(name, bits, models_dir, tokenizer_dir):
    stats = check(quantized(models_dir, tokenizer_dir, name, bits), block=5)
    assert 0 < stats.accepted < stats.drafted, (name, bits)  # some drafts kept, some rolled back


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", FAMILIES)
def test_quantized_block_sweep(name, bits, models_dir, tokenizer_dir):
    target = quantized(models_dir, tokenizer_dir, name, bits)
    for block in (2, 8, 16):
        for error_rate in (0.0, 0.3, 1.0):
            check(target, block, error_rate, n=30)
