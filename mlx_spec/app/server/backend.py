"""The model and everything that runs it. MLX is not thread-safe: only the scheduler's worker thread calls in here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx_spec

from .config import ModelConfig
from .prefix_cache import PrefixCachePool
from .sequence import Sequence


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP side needs to validate requests; fixed once the model is loaded."""

    id: str
    context_length: int
    vocab_size: int
    speculative: bool
    block_size: int | None
    max_prompt_chars: int | None = None  # a longer prompt cannot fit the context (see `prompt_char_bound`)


class Backend:
    def __init__(self, cfg: ModelConfig, prefix_cache_size: int):
        self.cfg, self.prefix_cache_size = cfg, prefix_cache_size
        self.model = self.tokenizer = self.pool = self.info = None

    def load(self) -> None:
        self.model, self.tokenizer = self.load_model()
        self.pool = PrefixCachePool(lambda: mlx_spec.make_prompt_cache(self.model), self.prefix_cache_size)
        drafter = self.model.drafter
        mlx_spec.check_block_size(self.model, self.cfg.block_size)  # a bad --block-size fails at start-up
        self.info = ModelInfo(
            id=self.cfg.served_name or model_id(self.cfg.target), context_length=self.model.context_length,
            vocab_size=self.model.vocab_size, speculative=drafter is not None,
            block_size=(self.cfg.block_size or drafter.block_size) if drafter is not None else None,
            max_prompt_chars=prompt_char_bound(self.tokenizer, self.model.context_length))
        if drafter is not None and self.cfg.block_size is None:  # while /health says loading, not in a first request
            mlx_spec.cost_curve(self.model)

    def load_model(self):
        """(model, tokenizer); a distributed backend loads its rank's share instead."""
        return mlx_spec.load(self.cfg.target, drafter=self.cfg.drafter, mode=self.cfg.mode, dtype=self.cfg.dtype,
                             kernels=self.cfg.kernels, block_size=self.cfg.block_size, kv_bits=self.cfg.kv_bits,
                             kv_group_size=self.cfg.kv_group_size)

    def start(self, seq: Sequence) -> None:
        """Give the request a cache (sharing its prefix when one is idle) and its generation."""
        job = seq.job
        seq.cache = self.pool.acquire(job.ids, job.partition)
        seq.gen = mlx_spec.make_generation(
            self.model, self.tokenizer, job.ids, job.max_tokens, sampling=job.sampling, stop=job.stop,
            prompt_cache=seq.cache, block_size=self.cfg.block_size, kind=job.kind)
        seq.prefilling = seq.gen.prefill(self.cfg.prefill_chunk)

    def prefill_step(self, seq: Sequence) -> None:
        """One prefill chunk; the last one delivers the first token and the request joins the batch."""
        item = next(seq.prefilling)
        if isinstance(item, mlx_spec.GenerationResponse):
            seq.prefilling = None
            seq.on_round(item)

    def step(self, seqs: list[Sequence]) -> None:
        """One verify round for every active request: their blocks share one batched target pass."""
        for seq, response in zip(seqs, mlx_spec.step_all(self.model, [s.gen for s in seqs])):
            seq.on_round(response)

    def stop(self, seq: Sequence, reusable: bool) -> None:
        """Return the cache; a cache left mid-round by an error is dropped."""
        if seq.cache is not None and reusable:
            seq.cache.leave_batch()
            self.pool.release(seq.cache, seq.job.partition)
        seq.gen = seq.cache = None


CHARS_PER_TOKEN_CAP = 32


def prompt_char_bound(tokenizer, context_length: int) -> int:
    """Characters past which a prompt cannot fit the context, checked before tokenizing.

    No token covers more characters than the longest vocabulary entry, so a longer text needs
    more tokens than the context holds. The factor is capped at 32 (vocabularies carry a few
    very long whitespace or punctuation runs): only text averaging over 32 characters per
    token, across a whole context's worth, is refused early.
    """
    longest = max((len(t) for t in tokenizer.get_vocab()), default=CHARS_PER_TOKEN_CAP)
    return context_length * min(longest, CHARS_PER_TOKEN_CAP)


def model_id(target: str | None) -> str:
    """A short public name: a repo id as given, a local folder by its name (never the full path)."""
    if target is None:
        return "mlx-spec-default"
    path = Path(target).expanduser()
    return path.name if path.exists() else str(target)
