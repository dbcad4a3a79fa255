"""Sampled speculative output on hybrids follows the target's exact joint law (chi-square), with several
drafts per round, so recurrent states are rewound and replayed inside the runs: a Gated DeltaNet model
(qwen3_5) and a Mamba2 one (nemotron_h). Unseeded runs use rejection sampling, seeded runs
position-keyed Gumbel draws. The helpers are tests/test_lossless_sampling.py's."""

from types import SimpleNamespace

import pytest

import archs
import factory
import mlx_spec
from mlx_spec.engine.sampling import SamplingParams
from test_lossless_sampling import N_TOKENS, PROMPT, chi2_pvalue, count_runs, exact_joint

PARAMS = SamplingParams(temperature=1.0, top_k=3)
RUNS = 400


class _WithVocab:
    """exact_joint reads `model.args.vocab_size`; qwen3_5 nests it under text_config."""

    def __init__(self, model, vocab):
        self.model, self.args = model, SimpleNamespace(vocab_size=vocab)

    def __call__(self, x):
        return self.model(x)


def pvalue(models_dir, tokenizer_dir, name, seeded):
    # small logit scale: spread-out laws make a bias visible; 2 layers: one recurrent, one attention
    target = archs.make(models_dir / f"flat-{name}", tokenizer_dir, name, layers=2, seed=7, scale=1.6,
                        **({"text_config": {**archs.FAMILIES[name]["text_config"], "num_hidden_layers": 2}}
                           if name == "qwen3_5" else {}))
    model, tok = mlx_spec.load(str(target), drafter=None)
    exact = exact_joint(_WithVocab(model.model, model.config["vocab_size"]), tok.encode(PROMPT), PARAMS, N_TOKENS)
    model.drafter = factory.SelfDrafter(model.model, block_size=4, mode="sampled")
    counts = count_runs(model, tok, PARAMS, RUNS, blocks=(4, 3), seeded=seeded)
    drafted, accepted = zip(*count_runs.positions)
    assert drafted[1] > 0 and 0 < accepted[0] < drafted[0]  # several drafts a round, some rejected
    return chi2_pvalue(exact, counts, RUNS)


@pytest.mark.parametrize("name,seeded", [("qwen3_5", False), ("nemotron_h", True),
                                         pytest.param("qwen3_5", True, marks=pytest.mark.slow),
                                         pytest.param("nemotron_h", False, marks=pytest.mark.slow)])
def test_hybrid_sampling_follows_target(models_dir, tokenizer_dir, name, seeded):
    assert pvalue(models_dir, tokenizer_dir, name, seeded) > 1e-3
