"""Recurrent and convolutional layer state (Gated DeltaNet, Mamba2, short convolutions, KDA) that rolls back exactly.

A recurrent state cannot drop its newest steps: it is one array summarizing all of them. But
mlx-lm's layers (qwen3_5, qwen3_next, nemotron_h, falcon_h1, lfm2, granitemoehybrid,
kimi_linear) write each new state as a whole new array (`cache[0] = ...`, then
`cache.advance(S)`), and MLX arrays are immutable, so keeping the state as it was before the
latest update costs one reference per slot, never a copy.

Rollback is then checkpoint + replay: `rewind(n)` puts back the state from before the latest
update of S tokens and reports S - n tokens to feed again; the prompt cache replays those
(the accepted ones) through the recurrent mixers alone, from their inputs recorded in the verify
pass (below; else through the decoder stack). Only rounds that rejected a draft pay for it; a fully
accepted block, plain decoding and prefill never replay. (Measured against recording a state per
step during verify: see `mlx-spec doctor`'s rollback line and the README's support table.)
"""

from __future__ import annotations

import inspect

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from ..target import retyped


class RecurrentCache(ArraysCache):
    """An ArraysCache (or MambaCache) that remembers its state from before the latest update."""

    def __init__(self, size: int):
        super().__init__(size)
        self.offset = 0  # tokens summarized by the state
        self.last_n = 0  # tokens of the latest update
        self.pending = 0  # tokens rewound but not yet replayed (see PromptCache.add)
        self._before: list | None = None  # slot values before the latest update
        self._writing = False  # inside an update: slots already saved

    @classmethod
    def like(cls, cache: ArraysCache) -> "RecurrentCache":
        return cls(len(cache.cache))

    def __setitem__(self, idx, value):
        if not self._writing:  # the first write of an update: keep what it replaces
            self._before, self._writing = list(self.cache), True
        self.cache[idx] = value

    def advance(self, N: int):
        super().advance(N)
        self.offset += N
        self.last_n, self._writing = N, False

    def rewind(self, n: int) -> int:
        """Undo the latest update and return how many of its tokens must be replayed (its first S - n)."""
        if n <= 0:
            return 0
        if self._before is None or n > self.last_n:
            raise ValueError(f"a recurrent state can only rewind within its latest update ({self.last_n} tokens)")
        self.cache, self._before = self._before, None
        self.offset -= self.last_n
        self.pending, self.last_n = self.last_n - n, 0
        return self.pending

    def max_trim(self) -> int:
        return 0  # further back than the latest update: only from a checkpoint (PromptCache)

    def is_trimmable(self) -> bool:
        return True  # within the latest update, by replay

    def snapshot(self):
        return list(self.cache), self.offset

    def restore(self, snap) -> None:
        cache, self.offset = snap
        self.cache = list(cache)
        self._before, self.last_n, self.pending, self._writing = None, 0, 0, False

    def trim(self, n: int) -> int:
        raise TypeError("a recurrent state rolls back with rewind + replay (engine.cache.trim), not trim")


# ----------------------------------------------------------------------------- replay from the verify pass
#
# A rewound state must be fed the accepted tokens again. Feeding them through the whole decoder stack
# recomputes what the verify pass already computed: each recurrent layer's input at those positions
# (causal layers: a position's hidden state never depends on later, rejected tokens). So each recurrent
# mixer keeps its latest call's arguments (a subclass of mlx-lm's own class, substituted into the loaded
# model like the kernels' attention: same parameters, same code), and the replay calls only those mixers
# on the first n positions of their recorded inputs. Their outputs are never read, so MLX computes only
# what the states depend on: no attention, MLP, output projection or LM head.

_RECORDING: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    sub = _RECORDING.get(cls)
    if sub is None:
        def __call__(self, *args, **kwargs):
            object.__setattr__(self, "_spec_call", (args, kwargs))  # a plain attribute, not a child module
            return cls.__call__(self, *args, **kwargs)

        sub = _RECORDING[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "_spec_base": cls,
                                                             "_spec_signature": inspect.signature(cls.__call__)})
    return sub


def recurrent_mixers(model, layers: list, caches: list) -> dict[int, nn.Module] | None:
    """For each layer whose cache is a RecurrentCache, the one child module that takes the cache (the
    mixer), made a recording one; None when the layout is not that simple (caches not one per layer, a
    recurrent state inside a CacheList, several children taking the cache): then replay runs the stack."""
    found = model.__dict__.get("_spec_mixers", False)
    if found is not False:
        return found
    def takers(layer):
        return [(name, m) for name, m in layer.children().items() if isinstance(m, nn.Module)
                and "cache" in inspect.signature(type(m).__call__).parameters]

    def unwrapped(layer):  # under a hidden-state tap (target.LayerTap) or a pipeline stage's wrapper
        while isinstance(layer.get("inner"), nn.Module):
            layer = layer["inner"]
        return layer

    layers = [unwrapped(layer) for layer in layers]
    if len(layers) != len(caches):  # nemotron_h: the MLP blocks have no cache; the others have one each, in order
        layers = [layer for layer in layers if takers(layer)]
    out: dict[int, nn.Module] | None = {} if len(layers) == len(caches) else None
    for i, c in enumerate(caches if out is not None else ()):
        if not isinstance(c, RecurrentCache):
            if any(isinstance(x, RecurrentCache) for x in getattr(c, "caches", ())):
                out = None
                break
            continue
        layer = layers[i]
        takes = takers(layer)
        if len(takes) != 1:
            out = None
            break
        name, mixer = takes[0]
        if not hasattr(type(mixer), "_spec_base"):
            mixer = retyped(mixer, _recording_class(type(mixer)))
            layer.update_modules({name: mixer})
        out[i] = mixer
    object.__setattr__(model, "_spec_mixers", out)
    return out


def replay_mixers(mixers: dict[int, nn.Module], cache_lists: list[list], n: int, view=None) -> bool:
    """Feed the first n positions of the latest verify pass again to the recurrent mixers, for the rows whose
    per-layer caches are `cache_lists` (rewound). False, with nothing done, when a mixer's latest call was
    not that verify pass over those caches, or had a mask (padding)."""
    calls = []
    for i, mixer in mixers.items():
        record = mixer.__dict__.get("_spec_call")
        if record is None:
            return False
        bound = type(mixer)._spec_signature.bind(mixer, *record[0], **record[1])
        args = bound.arguments
        seen, first = args.get("cache"), list(args)[1]  # the parameter after self: the hidden states
        if args.get("mask") is not None or seen is None:
            return False
        rows_caches = getattr(seen, "caches", [seen])  # a batched pass saw a StateView of the rows' caches
        rows = []
        for caches in cache_lists:
            row = next((r for r, c in enumerate(rows_caches) if c is caches[i]), None)
            if row is None:
                return False
            rows.append(row)
        batch = args[first].shape[0]
        if rows != list(range(batch)):  # a subset of the pass's rows; per-row arguments (bailing's rope
            pick = mx.array(rows)       # offsets, one per row) follow their rows
            for name, a in list(args.items())[1:]:
                if name != "cache" and isinstance(a, mx.array) and a.ndim and a.shape[0] == batch:
                    args[name] = a[pick]
        args[first] = args[first][:, :n]
        args["cache"] = cache_lists[0][i] if len(cache_lists) == 1 else view([caches[i] for caches in cache_lists])
        calls.append((mixer, bound))
    for mixer, bound in calls:
        type(mixer)._spec_base.__call__(*bound.args, **bound.kwargs)
    return True
