"""Chain drafting with one decoder layer fed by the target's features (shared by EAGLE-3 and native MTP).

Both formats run one layer over pairs (g_j, x_{j+1}): g_j is a feature of the target at position j
(fused tapped layers for EAGLE-3, the last hidden state for MTP) and x_{j+1} the token that follows
it; the output predicts x_{j+2}. Drafting chains the layer: its own output becomes the next g.

The layer's KV cache holds committed pairs only. The last committed row's pair needs the token after
it, which is the next anchor, so its feature waits in `pending` until `propose` (which writes it and
the chained steps, then trims them all off again) or the next `observe` (which writes it for good).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from .base import Draft


class ChainState:
    """The layer's KV cache of committed pairs, the pending feature, and recent features for exact trim."""

    RECENT = 64  # features kept so that trimming up to this many rows restores the pending one exactly

    def __init__(self):
        self.cache = KVCache()
        self.pending: mx.array | None = None  # g of the last committed row [1, 1, H]
        self.recent: mx.array | None = None  # g of the last rows (up to RECENT) [1, r, H]
        self.rows = 0  # committed rows seen: the anchor sits at this position

    @property
    def offset(self) -> int:
        return self.rows

    def trim(self, n: int) -> int:
        n = min(n, self.rows)
        if n == 0:
            return 0
        self.rows -= n
        self.cache.trim(min(n, self.cache.offset))  # the cache holds rows - 1 pairs
        r = 0 if self.recent is None else self.recent.shape[1]
        if self.rows == 0:
            self.pending = self.recent = None
        elif n < r:
            self.recent = self.recent[:, : r - n]
            self.pending = self.recent[:, -1:]
        else:  # further back than the features kept: the next observe stands in its first row's feature
            self.pending = self.recent = None
        return n


class ChainDrafter:
    """Subclasses give `features` (target taps -> g), `step` (the layer) and `logits`/`feedback`."""

    tap_ids: tuple[int, ...] = ()
    block_size: int = 8

    def make_state(self) -> ChainState:
        return ChainState()

    def context_spans(self, state: ChainState) -> list[int]:
        return [0]  # one layer over every committed row

    def features(self, hidden: mx.array) -> mx.array:
        """Tapped hidden states [1, n, taps*H_t] -> g [1, n, H]."""
        raise NotImplementedError

    def step(self, g: mx.array, tokens: mx.array, cache) -> mx.array:
        """The layer over pairs (g_j, x_{j+1}) [1, n, H] and [1, n] -> output [1, n, H]."""
        raise NotImplementedError

    def logits(self, out: mx.array) -> mx.array:
        """Layer output [1, n, H] -> float32 logits over the target's vocabulary [n, V]."""
        raise NotImplementedError

    def feedback(self, out: mx.array) -> mx.array:
        """The g the next chained step reads."""
        return out

    def greedy_tokens(self, out: mx.array) -> mx.array:
        return self.logits(out).argmax(-1).astype(mx.int32)

    def observe(self, state: ChainState, hidden: mx.array, tokens: list[int]) -> None:
        g = self.features(hidden)
        pending = state.pending
        if state.rows and pending is None:
            pending = g[:, :1]  # lost by a deep trim: the nearest committed feature stands in
        if state.rows:
            pairs_g, pairs_x = mx.concatenate([pending, g[:, :-1]], axis=1), tokens
        else:
            pairs_g, pairs_x = g[:, :-1], tokens[1:]
        if pairs_x:
            # Only the keys/values are kept; the outputs of committed pairs are never evaluated.
            self.step(pairs_g, mx.array([pairs_x]), state.cache)
        state.pending = g[:, -1:]
        recent = g if state.recent is None else mx.concatenate([state.recent, g], axis=1)
        state.recent = recent[:, -ChainState.RECENT:]
        state.rows += len(tokens)

    def propose(self, state: ChainState, anchor: int, k: int, sampling) -> Draft:
        g, token = state.pending, mx.array([anchor], mx.int32)
        tokens, qs = [], []
        for _ in range(k):
            out = self.step(g, token[None], state.cache)
            if sampling.greedy:
                token = self.greedy_tokens(out)
            else:
                qs.append(sampling.probs(self.logits(out)))
                token = sampling.draw(qs[-1])
            tokens.append(token)
            g = self.feedback(out)
        state.cache.trim(k)  # drafted pairs are speculative: only committed pairs stay
        if not tokens:
            return Draft(mx.zeros((0,), mx.int32))
        return Draft(mx.concatenate(tokens), mx.concatenate(qs) if qs else None)


def causal_mask(x: mx.array, cache):
    """The mask of a pass over x [1, n, ...] after what `cache` holds (None for one row)."""
    return create_attention_mask(x, cache, return_array=True) if x.shape[1] > 1 else None


def quantize_like(model: nn.Module, weights: dict) -> None:
    """Quantize the modules whose checkpoint tensors are quantized (affine), with the bits and group size
    their shapes imply, so that a drafter quantized apart from its target needs no settings of its own."""

    def settings(path: str, module: nn.Module):
        scales = weights.get(f"{path}.scales")
        if scales is None or not hasattr(module, "to_quantized"):
            return False
        dims = module.weight.shape[-1]
        return {"group_size": dims // scales.shape[-1], "bits": weights[f"{path}.weight"].shape[-1] * 32 // dims}

    nn.quantize(model, class_predicate=settings)
