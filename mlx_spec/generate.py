"""mlx-lm style generation API around the speculative loop: streaming text, stop conditions, stats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx

from .engine.cache import PromptCache
from .engine.loop import FixedLength, Round, speculative_rounds
from .engine.sampling import Sampler, SamplingParams
from .errors import ContextOverflowError, MlxSpecError
from .loading import Loaded
from .stops import StopMatcher


@dataclass
class SpecStats:
    """Speculation statistics of one run (vLLM-style counters)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        grow = r.drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(r.drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < r.accepted

    @property
    def tau(self) -> float:
        """Acceptance length: tokens committed per verify round, bonus included."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rates(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "tau": round(self.tau, 4), "acceptance_rates": [round(x, 4) for x in self.acceptance_rates]}


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


def encode_prompt(tokenizer, prompt) -> list[int]:
    """A string, a token list, or chat messages (rendered with the tokenizer's chat template)."""
    if isinstance(prompt, mx.array):
        return prompt.tolist()
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
    if isinstance(prompt, str):
        bos = tokenizer.bos_token
        return tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
    return list(prompt)


def make_prompt_cache(model: Loaded) -> PromptCache:
    return PromptCache(model.target.model, model.drafter)


def stream_generate(model: Loaded, tokenizer, prompt, max_tokens: int = 256, *,
                    sampling: SamplingParams | None = None, stop: list[str] | None = None,
                    prompt_cache: PromptCache | None = None, block_size: int | None = None,
                    adaptive: bool = True, draft_lengths=None, **sampling_kwargs) -> Iterator[GenerationResponse]:
    """Yield one response per verify round; the last has `finish_reason` and the run's `spec` stats.

    Sampling options (temperature, top_p, top_k, min_p, penalties, seed) may be given as keywords
    or as a `SamplingParams`. Speculation is used when `model` has a drafter: with a fixed block
    when `block_size` is given, else with a draft length chosen each round from this machine's
    cost curve and the observed acceptance (`adaptive=False`: always the drafter's full block).
    """
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
    pc = prompt_cache if prompt_cache is not None else make_prompt_cache(model)
    if draft_lengths is None:
        draft_lengths = choose_lengths(model, block_size, adaptive)
    sampler = Sampler(sampling, vocab_size=_vocab(model))
    yield from _stream(model, tokenizer, ids, max_tokens, sampler, stop or [], pc, draft_lengths)


def choose_lengths(model: Loaded, block_size: int | None, adaptive: bool):
    drafter = model.drafter
    if drafter is None:
        return FixedLength(0)
    if block_size is not None or not adaptive:
        return FixedLength(max(0, (block_size or drafter.block_size) - 1))
    from .calibrate import AdaptiveLength, calibrated_curve

    return AdaptiveLength(calibrated_curve(model, drafter.block_size), drafter.block_size - 1)


def _stream(model, tokenizer, ids, max_tokens, sampler, stop, pc, lengths) -> Iterator[GenerationResponse]:
    detok = tokenizer.detokenizer
    detok.reset()
    stops = StopMatcher(stop)
    eos = set(tokenizer.eos_token_ids)
    stats, n, finish = SpecStats(), 0, None
    tic = time.perf_counter()
    cached = 0
    rounds = speculative_rounds(model.target, model.drafter, pc, ids, sampler, lengths)
    for i, r in enumerate(rounds):
        if i == 0:
            prefill_time = time.perf_counter() - tic
            cached = pc.reused
            tic = time.perf_counter()
        else:
            stats.add(r)
        tokens = r.tokens[: max_tokens - n]
        for j, t in enumerate(tokens):
            if t in eos:
                tokens, finish = tokens[:j], "stop"
                break
        for t in tokens:
            detok.add_token(t)
        n += len(tokens)
        if finish is None and n >= max_tokens:
            finish = "length"
        if finish is not None:
            detok.finalize()
        text, hit = stops.feed(detok.text, final=finish is not None)
        if hit:
            finish = "stop"
        elapsed = max(time.perf_counter() - tic, 1e-9)
        yield GenerationResponse(
            text=text, token=tokens[-1] if tokens else None, tokens=tokens,
            prompt_tokens=len(ids), prompt_tps=(len(ids) - cached) / max(prefill_time, 1e-9),
            generation_tokens=n, generation_tps=(n - 1) / elapsed if n > 1 else 0.0,
            peak_memory=mx.get_peak_memory() / 1e9, finish_reason=finish,
            accepted=r.accepted, drafted=r.drafted, cached_tokens=cached,
            time_to_first_token=prefill_time, spec=stats if finish else None,
        )
        if finish is not None:
            return


def _vocab(model: Loaded) -> int:
    return int(model.config.get("vocab_size") or model.config.get("text_config", {}).get("vocab_size", 0))


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
