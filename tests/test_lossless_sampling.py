"""Sampled speculative output follows the target's distribution (chi-square over seeded runs)."""

import itertools

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler
from scipy.stats import chisquare

import factory
import mlx_spec
from mlx_spec.engine.sampling import Sampler, SamplingParams

PROMPT = "def add(a, b):"
N_TOKENS = 3


@pytest.fixture(scope="module")
def flat_target(models_dir, tokenizer_dir):
    # Small logit scale: spread-out distributions make any bias visible.
    return factory.make_target(models_dir / "flat", tokenizer_dir, "qwen3", layers=2, seed=7, scale=1.6)


def exact_joint(model, ids, params, n):
    """P(first n tokens) by enumeration, using the distribution mlx-lm's sampler draws from."""
    sampler = Sampler(params, model.args.vocab_size)
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for prefix, pr in out.items():
            logits = model(mx.array([ids + list(prefix)]))[0, -1:].astype(mx.float32)
            p = np.array(sampler.probs(logits)[0])
            for t in np.nonzero(p > 1e-9)[0]:
                nxt[prefix + (int(t),)] = pr * float(p[t])
        out = nxt
    return out


def sample_runs(model, tok, params, runs, mode):
    model.drafter = factory.SelfDrafter(model.model, block_size=3, mode=mode)
    return count_runs(model, tok, params, runs)


def count_runs(model, tok, params, runs):
    """How often each first-N_TOKENS sequence comes out over `runs` seeded speculative runs."""
    cache, counts = mlx_spec.make_prompt_cache(model), {}
    for seed in range(runs):
        p = SamplingParams(**{**params.__dict__, "seed": seed})
        toks = [t for r in mlx_spec.stream_generate(model, tok, PROMPT, N_TOKENS, sampling=p, prompt_cache=cache,
                                                    block_size=3) for t in r.tokens]
        counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
    return counts


def chi2_pvalue(exact, counts, runs):
    cells = sorted(exact, key=exact.get, reverse=True)
    f_exp, f_obs, rest_e, rest_o = [], [], 0.0, 0
    for c in cells:
        e = exact[c] * runs
        if e >= 5:
            f_exp.append(e)
            f_obs.append(counts.get(c, 0))
        else:
            rest_e += e
            rest_o += counts.get(c, 0)
    rest_o += sum(v for k, v in counts.items() if k not in exact)  # impossible sequences
    f_exp.append(rest_e + 1e-9)
    f_obs.append(rest_o)
    return chisquare(f_obs, np.array(f_exp) * sum(f_obs) / sum(f_exp)).pvalue


CONFIGS = [
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=0.7, top_k=4, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=3, min_p=0.05),
]


@pytest.mark.parametrize("params", CONFIGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-minp{p.min_p}")
@pytest.mark.parametrize("mode", ["sampled", "argmax-onehot"])
def test_speculative_sampling_matches_target(flat_target, params, mode):
    model, tok = mlx_spec.load(str(flat_target), drafter=None)
    ids = tok.encode(PROMPT)
    exact = exact_joint(model.model, ids, params, N_TOKENS)
    runs = 1200
    counts = sample_runs(model, tok, params, runs, mode)
    assert chi2_pvalue(exact, counts, runs) > 1e-3


def test_soft_q_bug_is_detected(flat_target):
    """Argmax drafts verified against a soft q are biased; the same test must reject them."""
    params = CONFIGS[0]
    model, tok = mlx_spec.load(str(flat_target), drafter=None)
    exact = exact_joint(model.model, tok.encode(PROMPT), params, N_TOKENS)
    runs = 1200
    counts = sample_runs(model, tok, params, runs, "argmax-softq")
    assert chi2_pvalue(exact, counts, runs) < 1e-4


def test_distribution_is_mlx_lm_sampler(flat_target):
    """Sampler.probs is exactly the law mlx-lm's own sampler draws from."""
    model, _ = mlx_lm.load(str(flat_target))
    logits = model(mx.array([[5, 6, 7]]))[0, -1:].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for params in CONFIGS:
        p = np.array(Sampler(params, logits.shape[-1]).probs(logits)[0]).astype(np.float64)
        draw = make_sampler(params.temperature, params.top_p, params.min_p, top_k=params.top_k)
        mx.random.seed(0)
        samples = np.array(draw(mx.broadcast_to(logprobs, (6000, logits.shape[-1]))))
        support = np.nonzero(p > 1e-9)[0]
        assert set(np.unique(samples)) <= set(support)
        obs = np.array([(samples == t).sum() for t in support])
        assert chisquare(obs, p[support] * len(samples) / p[support].sum()).pvalue > 1e-3


def test_seed_reproducible(flat_target):
    model, tok = mlx_spec.load(str(flat_target), drafter=None)
    model.drafter = factory.SelfDrafter(model.model, block_size=4)
    runs = [mlx_spec.generate(model, tok, PROMPT, 20, temperature=0.9, seed=11, block_size=4) for _ in range(2)]
    assert runs[0] == runs[1]
