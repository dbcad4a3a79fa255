"""A pipeline stage of the target: this rank's decoder layers, wired to the stages before and after.

The model's own forward runs untouched over the rank's layer list (only its own layers: caches,
masks and RoPE offsets come out as in one process). Two wrappers around the end layers move data:

- `Enter` (first local layer): replaces the embedding with the activations the previous stage sent,
  [B, M, H] followed by the tapped hidden states of the layers before this stage;
- `Leave` (last local layer, all but the last stage): sends its output, those taps and its own taps
  to the next stage, and starts the send at once, so that a pass whose outputs nobody reads (a
  prefill chunk) still feeds the next stage.

Replays (a rewound recurrent state fed its accepted tokens again) need no network: a stage replays
the first rows of the input it received in that request's latest pass, which is exactly what the
stages before it would send again. So ranks whose layers hold no recurrent state, and replay
nothing, never wait for those that do.

On the last stage the taps arrive in layer order, as one process's taps do; its logits are shared
with every rank (sent along the ranks: bitwise the last stage's values; `session.from_root`).
"""

from __future__ import annotations

import weakref

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import CacheList

from ..target import LayerTap, LayerWrapper, Target
from ..errors import LoadError
from .layout import Layout
from .session import from_root


class _Link:
    """What the wrappers of one pass share: the taps received from upstream, where this pass's
    local taps start in the sink."""

    def __init__(self, layout: Layout, group, sink, n_upstream: int):
        self.layout, self.group, self.sink, self.n_upstream = layout, group, sink, n_upstream
        self.upstream: mx.array | None = None
        self.mark = 0
        self.live = False  # inside PipelineTarget.__call__ (else: a replay pass through the body)
        self.inputs = weakref.WeakKeyDictionary()  # a request's first-layer cache -> (input [B, M, H], row)

    def local_taps(self) -> list[mx.array]:
        return self.sink.values[self.mark :]


class _Wrapper(LayerWrapper):
    def __init__(self, inner: nn.Module, link: _Link):
        super().__init__(inner)
        self._link = link


def _rows(cache) -> list:
    """One per-request cache for each row of a layer's cache argument: the key under which that
    request's stage input is kept. A batch view holds several requests' caches; a CacheList (one
    request's, or a batch of them: a CacheList of views) is keyed by its first child's."""
    if isinstance(cache, CacheList):
        return _rows(cache.caches[0])
    return list(cache.caches) if hasattr(cache, "caches") and not hasattr(cache, "state") else [cache]


class Enter(_Wrapper):
    def __call__(self, x, *args, **kwargs):
        link = self._link
        link.mark, link.upstream = len(link.sink.values), None
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)  # mlx-lm layers: (x, mask, cache)
        if link.layout.source is not None and not link.live:  # a replay: this stage's input, kept
            n = x.shape[1]
            x = mx.concatenate([got[row : row + 1, :n] for got, row in (link.inputs[c] for c in _rows(cache))])
        elif link.layout.source is not None:
            h = x.shape[-1]
            payload = mx.distributed.recv((*x.shape[:-1], h * (1 + link.n_upstream)), x.dtype,
                                          link.layout.source, group=link.group)
            x = payload[..., :h]
            link.upstream = payload[..., h:] if link.n_upstream else None
            if cache is not None:
                for row, c in enumerate(_rows(cache)):
                    link.inputs[c] = (x, row)
        return self.inner(x, *args, **kwargs)


class Leave(_Wrapper):
    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        link = self._link
        if not link.live:
            return out  # a replay: the next stage replays its own kept input
        parts = [out] + ([link.upstream] if link.upstream is not None else []) + link.local_taps()
        payload = mx.concatenate([p.astype(out.dtype) for p in parts], axis=-1) if len(parts) > 1 else out
        sent = mx.distributed.send(payload, link.layout.dest, group=link.group)
        mx.async_eval(sent)
        return out


def _unwrap(layer):
    while isinstance(layer, LayerWrapper):
        layer = layer.inner
    return layer


class PipelineTarget(Target):
    """The `Target` of one rank: its own layers; taps and `num_layers` in the whole model's numbering."""

    def __init__(self, model: nn.Module, layout: Layout, group, vocab_size: int, kernels=None, eval_every: int = 0):
        self.layout, self.group, self.vocab_size = layout, group, vocab_size
        self._link = None
        super().__init__(model, (), kernels=kernels, eval_every=eval_every)
        if len(self._layers) != layout.end - layout.start:
            raise LoadError(f"rank {layout.rank} holds {len(self._layers)} layers, its stage has "
                            f"{layout.end - layout.start}")
        from ..engine.cache import body
        from .reuse import prompt_cache_class

        self._body = body(model)
        self.prompt_cache_class = prompt_cache_class(group, layout)  # generate.make_prompt_cache builds these

    @property
    def num_layers(self) -> int:
        return self.layout.num_layers

    def set_taps(self, ids) -> None:
        for i in ids:
            if not 0 <= i < self.num_layers:
                raise LoadError(f"tap layer {i} is out of range for a target with {self.num_layers} layers")
        self.tap_ids = tuple(ids)
        self._install(self.tap_ids)

    def _install(self, ids):
        lay, layers = self.layout, self._layers
        self._link = _Link(lay, self.group, self._sink, sum(i < lay.start for i in set(ids)))
        n, last = self.eval_every, len(layers) - 1
        for j in range(len(layers)):
            layer = _unwrap(layers[j])
            start = n > 0 and j % n == n - 1 and j < last
            tap = self._sink if lay.start + j in ids else None
            if tap is not None or start:
                layer = LayerTap(layer, tap, start)
            if j == last and lay.dest is not None:
                layer = Leave(layer, self._link)
            if j == 0:
                layer = Enter(layer, self._link)
            layers[j] = layer

    def __call__(self, tokens: mx.array, cache, last: int | None = None) -> tuple[mx.array, mx.array | None]:
        shape = (*tokens.shape, self.vocab_size)  # (every row's logits, `last` or not: they are sent as one shape)
        # The tokens may still be lazy (plain decoding runs one token ahead): settle them first, so
        # that every rank finishes the previous pass's shared logits before this pass's sends and
        # receives start (a stage that ignores the tokens would otherwise wait on its receive while
        # the stage before it waits on those logits).
        mx.eval(tokens)
        self._link.live = True
        try:
            if not self.layout.is_last:
                self._body(tokens, cache=cache)  # Leave has started the send; nothing here is read
                self._sink.values.clear()
                return from_root(None, shape, mx.float32, self.group), None
            logits = self.model(tokens, cache=cache).astype(mx.float32)
        finally:
            self._link.live = False
        if logits.shape != shape:
            raise LoadError(f"the target's logits are {logits.shape}, expected {shape} (vocab_size in config.json)")
        hidden = None
        if self.tap_ids:
            link = self._link
            parts = ([link.upstream] if link.upstream is not None else []) + link.local_taps()
            hidden = mx.concatenate(parts, axis=-1)
        self._sink.values.clear()
        return from_root(logits, shape, mx.float32, self.group), hidden

    def check_taps(self, tokens: list[int]) -> None:
        """The one-process check needs the final norm and every layer on one rank; skipped here."""
