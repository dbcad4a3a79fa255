"""Multi-turn reuse: a follow-up turn reuses the cached prefix and still decodes losslessly."""

import mlx_spec


def test_follow_up_turn_reuses_prefix(target_dir, drafter_dir):
    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    chat = [{"role": "user", "content": "Hello, how are you"}]
    cache = mlx_spec.make_prompt_cache(model)
    first = list(mlx_spec.stream_generate(model, tok, chat, 12, prompt_cache=cache, block_size=4))
    reply = "".join(r.text for r in first)
    assert first[-1].cached_tokens == 0

    chat += [{"role": "assistant", "content": reply}, {"role": "user", "content": "def add(a, b):"}]
    second = list(mlx_spec.stream_generate(model, tok, chat, 12, prompt_cache=cache, block_size=4))
    fresh = list(mlx_spec.stream_generate(model, tok, chat, 12, block_size=4))
    prompt_len = second[-1].prompt_tokens
    assert second[-1].cached_tokens >= len(tok.apply_chat_template(chat[:1], add_generation_prompt=True))
    assert second[-1].cached_tokens < prompt_len
    assert [t for r in second for t in r.tokens] == [t for r in fresh for t in r.tokens]

    # A diverging history (edited first message) trims the cache back, drafter context included.
    edited = [{"role": "user", "content": "Hello, who are you"}]
    again = list(mlx_spec.stream_generate(model, tok, edited, 12, prompt_cache=cache, block_size=4))
    fresh = list(mlx_spec.stream_generate(model, tok, edited, 12, block_size=4))
    assert [t for r in again for t in r.tokens] == [t for r in fresh for t in r.tokens]
    assert cache.drafter_state().offset == len(cache.tokens) == cache.cache[0].offset


class Recorder:
    """A drafter that only records what it is shown."""

    tap_ids, block_size = (), 4

    class State:
        def __init__(self):
            self.tokens = []

        @property
        def offset(self):
            return len(self.tokens)

        def trim(self, n):
            del self.tokens[len(self.tokens) - n:]
            return n

    def __init__(self):
        self.calls = []

    def make_state(self):
        return self.State()

    def observe(self, state, hidden, tokens):
        self.calls.append(list(tokens))
        state.tokens += tokens


def test_drafter_sees_committed_rows_lazily(target_dir):
    from mlx_spec.engine.cache import PromptCache

    model, _ = mlx_spec.load(str(target_dir), drafter=None)
    rec = Recorder()
    pc = PromptCache(model.model, rec)
    pc.add([1, 2], None)
    pc.add([3], None)
    assert rec.calls == [] and pc.tokens == [1, 2, 3]  # nothing drafted yet: nothing observed
    assert pc.drafter_state().tokens == [1, 2, 3] and rec.calls == [[1, 2, 3]]  # one batched catch-up
    pc.add(list(range(10, 10 + PromptCache.FLUSH_ROWS)), None)  # a long plain stretch is flushed as it goes
    assert len(rec.calls) == 2 and pc.drafter_state().offset == len(pc.tokens)
    pc.add([7, 8], None)
    pc.truncate(4)  # pending rows and observed ones alike
    assert pc.tokens == [1, 2, 3, 10] and pc.drafter_state().tokens == [1, 2, 3, 10]


def test_rows_taken_back_unseen_never_reach_the_drafter(target_dir):
    """An idle cache reused by the next request goes back to the common prefix: the rows past it that the
    drafter had not seen yet (a finished answer's, decoded plainly) are dropped unseen, not caught up and then
    trimmed (that took 4 ms of every reuse of an idle server cache); the rows before it reach it once."""
    from mlx_spec.engine.cache import PromptCache

    model, _ = mlx_spec.load(str(target_dir), drafter=None)
    rec = Recorder()
    pc = PromptCache(model.model, rec)
    pc.add([1, 2, 3], None)
    assert pc.drafter_state().tokens == [1, 2, 3]
    pc.add([4, 5], None)
    pc.add([6, 7, 8], None)
    pc.truncate(6)
    assert rec.calls == [[1, 2, 3]]  # nothing more shown yet
    assert pc.drafter_state().tokens == [1, 2, 3, 4, 5, 6] and rec.calls[1:] == [[4, 5, 6]]
    pc.add([9, 10], None)
    pc.truncate(2)  # behind the rows it has seen: those are trimmed
    assert pc.drafter_state().tokens == [1, 2] and rec.calls[2:] == []


def test_a_cache_reused_after_plain_decoding_drafts_as_a_fresh_one(target_dir, drafter_dir):
    """The drafter of a reused cache whose last request decoded plainly (its rows still waiting) drafts what a
    fresh cache's drafter does after the same tokens: lookup and the model drafter back to one length."""
    import mlx.core as mx

    from mlx_spec.engine.sampling import Sampler, SamplingParams

    model, tok = mlx_spec.load(str(target_dir), drafter=str(drafter_dir))
    reused, fresh = mlx_spec.make_prompt_cache(model), mlx_spec.make_prompt_cache(model)
    list(mlx_spec.stream_generate(model, tok, "def add(a, b):\n", 24, prompt_cache=reused, block_size=1))
    again = list(mlx_spec.stream_generate(model, tok, "def add(x, y):\n", 16, prompt_cache=reused, block_size=4))
    alone = list(mlx_spec.stream_generate(model, tok, "def add(x, y):\n", 16, prompt_cache=fresh, block_size=4))
    assert again[-1].cached_tokens > 0 and [r.tokens for r in again] == [r.tokens for r in alone]
    assert reused.tokens == fresh.tokens
    greedy = Sampler(SamplingParams(), model.vocab_size).drafting(0)
    a, b = reused.drafter_state(), fresh.drafter_state()
    assert a.offset == b.offset == len(reused.tokens) and a.model.offset == b.model.offset == len(reused.tokens)
    drafts = [model.drafter.propose(s, reused.tokens[-1], 4, greedy).tokens for s in (a, b)]
    assert mx.array_equal(*drafts)
