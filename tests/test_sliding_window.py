"""Sliding-window targets (gemma3-style, gpt-oss-style with sinks): prefix reuse after the ring wraps is exact.

Every reuse — regenerate, edit the last message, a follow-up turn, the server's prefix pool — must
give the same tokens as a fresh cache, and `cached_tokens` must be what was really reused.
"""

import mlx.core as mx
import mlx_lm
import pytest

import archs
import factory
import mlx_spec
from mlx_spec.app.server.prefix_cache import PrefixCachePool
from mlx_spec.engine.cache import PromptCache
from mlx_spec.engine.rotating import SpecRotatingKVCache

N = 24  # generated tokens: with the prompt, far past the window of 8


@pytest.fixture(scope="module", params=["gemma3_text", "gpt_oss"])
def sw_target(request, models_dir, tokenizer_dir):
    return archs.make(models_dir / f"sw-{request.param}", tokenizer_dir, request.param, seed=5)


@pytest.fixture(scope="module")
def sw_drafter(sw_target):
    return factory.make_drafter(sw_target.parent / f"{sw_target.name}-dflash", sw_target, taps=(0, 2), block_size=4)


def run(model, tok, prompt, cache=None, n=N, block=4):
    rs = list(mlx_spec.stream_generate(model, tok, prompt, n, prompt_cache=cache,
                                       block_size=block if model.drafter is not None else None))
    return [t for r in rs for t in r.tokens], rs[-1]


def consistent(pc: PromptCache) -> None:
    """The cache holds exactly the tokens it says it holds."""
    offsets = {c.offset for c in pc.cache}
    assert offsets == {len(pc.tokens)}, offsets


def turns(tok, first_reply: str):
    hello = [{"role": "user", "content": "Hello, how are you"}]
    follow = hello + [{"role": "assistant", "content": first_reply}, {"role": "user", "content": "def add(a, b):"}]
    edited = follow[:-1] + [{"role": "user", "content": "for i in range(10):"}]
    return hello, follow, edited


@pytest.mark.parametrize("speculative", [False, True])
def test_regen_edit_and_follow_up_match_a_fresh_cache(sw_target, sw_drafter, speculative):
    model, tok = mlx_spec.load(str(sw_target), drafter=str(sw_drafter) if speculative else None)
    cache = mlx_spec.make_prompt_cache(model)
    hello, _, _ = turns(tok, "")
    first, _ = run(model, tok, hello, cache)
    assert any(isinstance(c, SpecRotatingKVCache) and c.offset > c.max_size for c in cache.cache)  # it wrapped
    _, follow, edited = turns(tok, tok.decode(first))
    # regenerate, follow up, edit the last message, regenerate that, and back to the first prompt
    for chat in (hello, follow, edited, edited, hello):
        got, last = run(model, tok, chat, cache)
        fresh, _ = run(model, tok, chat)
        assert got == fresh, chat
        ids = tok.apply_chat_template(chat, add_generation_prompt=True)
        assert 0 <= last.cached_tokens < len(ids)
        consistent(cache)


def test_reuse_gives_the_logits_of_a_fresh_prefill(sw_target):
    """The next-token logits after any reuse equal a fresh prefill's (the bug: off by 4.4 after a wrap)."""
    model, _ = mlx_spec.load(str(sw_target), drafter=None)
    target = model.target
    base = list(range(5, 45))  # 40 tokens, 5 windows

    def prefill(pc, prompt):  # as the loop does: chunks, then the last token alone
        done = pc.reuse(prompt)
        rest = prompt[done:]
        body = rest[:-1]
        for piece in [body[i : i + 8] for i in range(0, len(body), 8)] + [rest[-1:]]:
            logits, _ = target(mx.array([piece]), pc.cache)
            pc.add(piece, None)
        return done, logits[0, -1]

    for keep in (39, 38, 35, 30, 20, 3, 0):  # how much of the cached prompt the next one shares
        pc = PromptCache(target.model)
        prefill(pc, base)
        prompt = base[:keep] + [60, 61, 62]
        done, got = prefill(pc, prompt)
        _, want = prefill(PromptCache(target.model), prompt)
        assert mx.array_equal(got, want).item(), keep
        assert done in (0, keep), (keep, done)  # reused exactly, or started afresh: never half-wrong
        assert pc.reused == done
        consistent(pc)
    # rows kept beyond the window: a short rollback after a wrap is reused, not recomputed
    pc = PromptCache(target.model)
    prefill(pc, base)
    assert prefill(pc, base[:39] + [60])[0] == 39


def test_server_prefix_pool(sw_target):
    """The server's pool hands out idle caches by longest shared prefix; each request equals a fresh run."""
    model, tok = mlx_spec.load(str(sw_target), drafter=None)
    pool = PrefixCachePool(lambda: mlx_spec.make_prompt_cache(model), capacity=2)
    hello, _, _ = turns(tok, "")
    ids = tok.apply_chat_template(hello, add_generation_prompt=True)
    first, _ = run(model, tok, ids)
    _, follow, edited = turns(tok, tok.decode(first))
    requests = [hello, follow, hello, edited, follow, edited]
    for chat in requests:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True)
        pc = pool.acquire(ids)
        got, last = run(model, tok, ids, pc)
        assert got == run(model, tok, ids)[0], chat
        assert last.cached_tokens == pc.reused
        consistent(pc)
        pool.release(pc)


def plain(model_dir, prompt, n):
    model, tok = mlx_lm.load(str(model_dir))
    rs = list(mlx_lm.stream_generate(model, tok, prompt, max_tokens=n))
    tokens = [r.token for r in rs]
    return tokens[:-1] if rs[-1].finish_reason == "stop" else tokens


def test_sliding_window_draft_model(sw_target):
    """A sliding-window draft model rewinds its own ring exactly: drafting for itself, every draft is accepted."""
    model, tok = mlx_spec.load(str(sw_target), drafter=str(sw_target), mode="draft-model")
    for prompt in ("def add(a, b):", "Hello, how are you"):
        ref = plain(sw_target, prompt, 40)
        for block in (2, 4):
            got, last = run(model, tok, prompt, n=40, block=block)
            assert got == ref, (prompt, block)
            assert last.spec.accepted == last.spec.drafted, (prompt, block)
    # multi-turn with the draft model: its cache is rewound far past its window (rebuilt), still exact
    cache = mlx_spec.make_prompt_cache(model)
    chat = [{"role": "user", "content": "Hello, how are you"}]
    first, _ = run(model, tok, chat, cache)
    again, last = run(model, tok, chat, cache)
    assert again == first and last.spec.accepted == last.spec.drafted
    state = cache.drafter_state()
    assert all(c.offset == len(state.tokens) for c in state.cache)
    assert all(c._idx >= 0 for c in state.cache if isinstance(c, SpecRotatingKVCache))

