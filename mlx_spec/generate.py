"""mlx-lm style generation API around the speculative loop: streaming text, stop conditions, stats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx

from .chat_template import encode_chat
from .engine.cache import PromptCache
from .engine.loop import DecodeState, FixedLength, Round, prefill, step
from .engine.sampling import Sampler, SamplingParams
from .errors import ContextOverflowError, MlxSpecError
from .loading import Loaded
from .stops import StopMatcher


@dataclass
class SpecStats:
    """Speculation statistics of one run (vLLM-style counters)."""

    rounds: int = 0  # target passes after the prefill, plain rounds included
    drafting_rounds: int = 0  # rounds that verified at least one draft token
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.drafting_rounds += r.drafted > 0
        self.drafted += r.drafted
        self.accepted += r.accepted
        grow = r.drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(r.drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < r.accepted

    def merge(self, other: "SpecStats") -> None:
        """Add another run's counters (a session's totals over its replies)."""
        self.rounds += other.rounds
        self.drafting_rounds += other.drafting_rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        grow = len(other.drafted_per_position) - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i, (d, a) in enumerate(zip(other.drafted_per_position, other.accepted_per_position)):
            self.drafted_per_position[i] += d
            self.accepted_per_position[i] += a

    @property
    def tau(self) -> float:
        """Mean acceptance length (vLLM's): 1 + accepted drafts per round that drafted; 0 when none did."""
        return 1 + self.accepted / self.drafting_rounds if self.drafting_rounds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens committed per target pass, plain rounds included."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rates(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "drafting_rounds": self.drafting_rounds, "drafted": self.drafted,
                "accepted": self.accepted, "tau": round(self.tau, 4), "tokens_per_pass": round(self.tokens_per_pass, 4),
                "acceptance_rates": [round(x, 4) for x in self.acceptance_rates]}


@dataclass
class GenerationResponse:
    text: str
    token: int | None
    tokens: list[int]
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: str | None = None
    accepted: int = 0  # draft tokens accepted in the verify round behind this response
    drafted: int = 0
    cached_tokens: int = 0
    time_to_first_token: float = 0.0
    spec: SpecStats | None = None
    stop_string: str | None = None  # on the last response: the stop string that ended the text


def encode_prompt(tokenizer, prompt) -> list[int]:
    """A string, a token list, or chat messages (rendered with the tokenizer's chat template)."""
    if isinstance(prompt, mx.array):
        return prompt.tolist()
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return encode_chat(tokenizer, prompt)  # text in a message that looks like control tokens stays text
    if isinstance(prompt, str):
        bos = tokenizer.bos_token
        return tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
    return list(prompt)


def prompt_kind(prompt) -> str | None:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return "chat"
    return "raw" if isinstance(prompt, str) else None


def make_prompt_cache(model: Loaded, speculative: bool = True) -> PromptCache:
    """A conversation's cache; `speculative=False` for generations that will not draft (it feeds no drafter)."""
    cls = getattr(model.target, "prompt_cache_class", PromptCache)  # a pipeline stage's: reuse agreed by all ranks
    return cls(model.target.model, model.drafter if speculative else None, **model.kv_cache)


def make_generation(model: Loaded, tokenizer, prompt, max_tokens: int = 256, *,
                    sampling: SamplingParams | None = None, stop: list[str] | None = None,
                    prompt_cache: PromptCache | None = None, block_size: int | None = None,
                    adaptive: bool = True, speculative: bool = True, draft_lengths=None,
                    kind: str | None = None, **sampling_kwargs) -> "Generation":
    """A validated, not yet started generation (see `stream_generate` for the options). kind: "chat" or
    "raw" (plain text continued), whose acceptance the controller remembers apart; by default chat
    messages are "chat", a string "raw", token ids neither."""
    if sampling_kwargs:
        if "temp" in sampling_kwargs:
            sampling_kwargs["temperature"] = sampling_kwargs.pop("temp")
        try:
            sampling = SamplingParams(**{**(sampling.__dict__ if sampling else {}), **sampling_kwargs})
        except TypeError as e:
            raise MlxSpecError(str(e)) from None
    sampling = sampling or SamplingParams()
    if max_tokens is None or max_tokens < 1:
        raise MlxSpecError(f"max_tokens must be a positive integer, got {max_tokens}")
    ids = encode_prompt(tokenizer, prompt)
    if not ids:
        raise MlxSpecError("the prompt is empty")
    if len(ids) >= model.context_length:
        raise ContextOverflowError(len(ids), max_tokens, model.context_length)
    max_tokens = min(max_tokens, model.context_length - len(ids))
    check_block_size(model, block_size)
    pc = prompt_cache if prompt_cache is not None else make_prompt_cache(model, speculative)
    if draft_lengths is None:
        kind = kind or prompt_kind(prompt)
        draft_lengths = choose_lengths(model, block_size, adaptive, kind, len(ids)) if speculative else FixedLength(0)
    return Generation(model, tokenizer, ids, max_tokens, Sampler(sampling, vocab_size=model.vocab_size), stop or [], pc,
                      draft_lengths)


def stream_generate(model: Loaded, tokenizer, prompt, max_tokens: int = 256, **kwargs) -> Iterator[GenerationResponse]:
    """Yield one response per verify round; the last has `finish_reason` and the run's `spec` stats.

    Options: `sampling` (a `SamplingParams`) or its fields as keywords (temperature/temp, top_p,
    top_k, min_p, repetition/presence/frequency penalties, seed, logit_bias); `stop` strings;
    `prompt_cache` to reuse a conversation's prefix. Speculation is used when `model` has a
    drafter (and `speculative` is not False): with a fixed block when `block_size` is given, else
    with a draft length chosen each round from this machine's cost curve and the observed
    acceptance (`adaptive=False`: always the drafter's full block).
    """
    g = make_generation(model, tokenizer, prompt, max_tokens, **kwargs)
    yield g.start()
    while not g.finished:
        yield step_all(model, [g])[0]


def check_block_size(model: Loaded, block_size: int | None) -> None:
    """A fixed block is the anchor plus its drafts: 1 (plain) up to what the drafter can verify."""
    if block_size is None:
        return
    top = model.drafter.block_size if model.drafter is not None else 1 << 30  # plain decoding: any width is 1
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= top:
        what = f"from 1 to {top} (the drafter's block size)" if model.drafter is not None else "of at least 1"
        raise MlxSpecError(f"block size must be an integer {what}, got {block_size!r}")


def choose_lengths(model: Loaded, block_size: int | None, adaptive: bool, kind: str | None = None,
                   prompt_tokens: int = 0):
    """Fixed draft lengths, or the adaptive controller (starting from the estimates of recent requests
    of this kind and length). Any lengths keep output exact, seeded sampled output included (its tokens do not
    depend on the draft lengths: see `engine/sampling.py`)."""
    drafter = model.drafter
    if drafter is None:
        return FixedLength(0)
    if block_size is not None or not adaptive:
        return FixedLength((block_size or drafter.block_size) - 1)
    from .calibrate import calibrated_curve
    from .controller import AdaptiveLength

    curve = calibrated_curve(model, drafter.block_size)
    return AdaptiveLength(curve, drafter.block_size - 1, memory=model.memory, kind=kind,
                          prompt_tokens=prompt_tokens)


class Generation:
    """One request's generation, advanced a verify round at a time (alone or in a batch).

    Turns each round into a `GenerationResponse`: cuts at EOS and max_tokens, detokenizes,
    holds back and applies stop strings, and keeps the run's speculation stats.
    """

    def __init__(self, model: Loaded, tokenizer, ids: list[int], max_tokens: int, sampler: Sampler,
                 stop: list[str], pc: PromptCache, lengths):
        self.model, self.ids, self.max_tokens = model, ids, max_tokens
        self.state = DecodeState(pc, sampler, lengths, remaining=max_tokens)
        self.detok = tokenizer.detokenizer
        self.detok.reset()
        self.stops = StopMatcher(stop)
        self.eos = set(tokenizer.eos_token_ids)
        self.stats, self.n, self.finish = SpecStats(), 0, None
        self.prefill_time, self.cached, self.tic = 0.0, 0, time.perf_counter()

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def start(self) -> GenerationResponse:
        """Prefill the whole prompt; the response carries the first token."""
        for progress in self.prefill():
            if isinstance(progress, GenerationResponse):
                return progress

    def prefill(self, chunk: int = 512) -> Iterator[int | GenerationResponse]:
        """Prefill chunk by chunk, yielding prompt tokens done; the last item is the first response.

        A caller may stop iterating between chunks (a cancelled request): the cache stays consistent.
        """
        for item in prefill(self.model.target, self.state, self.ids, chunk):
            if isinstance(item, Round):
                self.prefill_time, self.cached = time.perf_counter() - self.tic, self.state.pc.reused
                self.tic = time.perf_counter()
                yield self.emit(item, count=False)
            else:
                yield item

    def _take(self, tokens: list[int]) -> tuple[list[int], str]:
        """The round's tokens up to EOS or up to the one that completes a stop string (setting `finish`),
        and the text they release."""
        text = ""
        for j, t in enumerate(tokens):
            if t in self.eos:
                self.finish = "stop"
                return tokens[:j], text
            self.detok.add_token(t)
            if self.stops.stops:  # token by token: the tokens after a stop string are not output
                more, hit = self.stops.feed(self.detok.text)
                text += more
                if hit:
                    self.finish = "stop"
                    return tokens[: j + 1], text
        return tokens, text if self.stops.stops else self.stops.feed(self.detok.text)[0]

    def emit(self, r: Round, count: bool = True) -> GenerationResponse:
        if count:
            self.stats.add(r)
        tokens, text = self._take(r.tokens[: self.max_tokens - self.n])
        self.n += len(tokens)
        self.state.remaining = self.max_tokens - self.n
        if self.finish is None and self.n >= self.max_tokens:
            self.finish = "length"
        if self.finish is not None and not self.stops.hit:  # the detokenizer's held-back tail
            self.detok.finalize()
            more, hit = self.stops.feed(self.detok.text, final=True)
            text += more
            self.finish = "stop" if hit else self.finish
        elapsed = max(time.perf_counter() - self.tic, 1e-9)
        return GenerationResponse(
            text=text, token=tokens[-1] if tokens else None, tokens=tokens, prompt_tokens=len(self.ids),
            prompt_tps=(len(self.ids) - self.cached) / max(self.prefill_time, 1e-9), generation_tokens=self.n,
            generation_tps=(self.n - 1) / elapsed if self.n > 1 else 0.0, peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=self.finish, accepted=r.accepted, drafted=r.drafted, cached_tokens=self.cached,
            time_to_first_token=self.prefill_time, spec=self.stats, stop_string=self.stops.hit,
        )


def step_all(model: Loaded, generations: list[Generation]) -> list[GenerationResponse]:
    """One verify round for several started, unfinished generations: their blocks share one target pass."""
    rounds = step(model.target, model.drafter, [g.state for g in generations])
    responses = [g.emit(r) for g, r in zip(generations, rounds)]
    for g in generations:
        if g.finished:
            g.state.pc.leave_batch()
    return responses


def generate(model: Loaded, tokenizer, prompt, max_tokens: int = 256, verbose: bool = False, **kwargs) -> str:
    """The whole completion as a string (mlx-lm's `generate` shape)."""
    text = []
    last = None
    for last in stream_generate(model, tokenizer, prompt, max_tokens, **kwargs):
        text.append(last.text)
        if verbose:
            print(last.text, end="", flush=True)
    if verbose and last is not None:
        print()
    return "".join(text)
