"""The target as the engine sees it: an mlx-lm model plus taps on chosen decoder layers.

Taps are small wrapper modules substituted into the loaded model's own layer list;
the model's forward is untouched, so any mlx-lm architecture with a list of decoder layers
works, whatever the layer type (attention, Gated DeltaNet, Mamba2, convolution).
"""

from __future__ import annotations

from functools import cached_property

import mlx.core as mx
import mlx.nn as nn

from .errors import LoadError


class _Sink:
    """Holds captured outputs; not an mlx container, so it never shows up as a parameter."""

    def __init__(self):
        self.values: list[mx.array] = []


def retyped(module: nn.Module, cls: type) -> nn.Module:
    """`module` as an instance of `cls` (a subclass of its class, or back): the same parameters, children and
    attributes, to be put in the model's place of it; mlx-lm's classes are never patched."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    dict.update(new, module)
    return new


class LayerWrapper(nn.Module):
    """A module standing in for a decoder layer in the model's own list; mlx-lm code inspects layers
    (e.g. `layer.is_linear`, `layer.self_attn`), so attributes it lacks are the wrapped layer's."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    @property
    def __class__(self):
        # Some models choose a layer's mask by its class (olmo_hybrid: `isinstance(layer,
        # FullAttentionDecoderLayer)`): isinstance() consults __class__, so it sees the wrapped layer's class
        # (and this one's: type() is unchanged, so `isinstance(x, LayerWrapper)` still holds).
        return type(self["inner"]) if "inner" in self else type(self)

    def __getattr__(self, key):
        try:
            return super().__getattr__(key)
        except AttributeError:
            if "inner" not in self:
                raise
            return getattr(self["inner"], key)


class LayerTap(LayerWrapper):
    """Runs the wrapped decoder layer; records its output (a tap) and/or starts computing it.

    Starting a layer's computation while the host still builds the layers above it overlaps
    graph building with compute (measured: 4% faster plain decoding on the CPU backend, 15%
    with OpenBLAS). On the last layer, `keep` rows: only the last ones go on to the final norm
    and LM head (a prompt's last chunk needs the logits of its last token alone)."""

    def __init__(self, inner: nn.Module, sink: _Sink | None, start: bool = False):
        super().__init__(inner)
        self._sink, self._start = sink, start
        self.keep: int | None = None

    def __call__(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        h = out[0] if isinstance(out, tuple) else out  # kimi_k3's layers return (hidden, residual blocks)
        if self._sink is not None:
            self._sink.values.append(h)
        if self._start:
            mx.async_eval(h)
        if self.keep is not None and not isinstance(out, tuple):
            return out[..., -self.keep :, :]  # the sequence axis is the one before the features (gemma3n: [A, B, L, H])
        return out


def find_layers(model: nn.Module) -> tuple[nn.Module, nn.Module, list]:
    """(the module that owns the decoder layer list, its parent, the list itself), found generically.

    The list object itself is returned (not a sliced copy such as `pipeline_layers`): taps are
    substituted into it. Layouts differ: `model.layers` (qwen3, llama, ...), `language_model.model.layers`
    (qwen3_5 and other multimodal checkpoints), `backbone.layers` (nemotron_h). The shallowest
    `layers` list of modules wins; among equals, the language model's.
    """
    level = [(model, model)]
    while level:
        found = [(mod, parent) for mod, parent in level
                 if isinstance(mod.get("layers"), list) and mod["layers"] and isinstance(mod["layers"][0], nn.Module)]
        if found:
            mod, parent = found[0]
            return mod, parent, mod["layers"]
        level = [(child, mod) for mod, _ in level for child in mod.children().values() if isinstance(child, nn.Module)]
    raise LoadError(f"{type(model).__module__} does not expose its decoder layers; cannot tap hidden states")


def _first(module: nn.Module, names: tuple[str, ...]):
    return next((module[n] for n in names if isinstance(module.get(n), nn.Module)), None)


EMBEDDINGS = ("embed_tokens", "embeddings", "wte", "word_embeddings")  # bailing: `word_embeddings`
FINAL_NORMS = ("norm", "norm_f", "final_layernorm", "embedding_norm", "ln_f")  # lfm2's final norm is `embedding_norm`


class Target:
    """Forward over M tokens returning logits and the concatenated tapped hidden states."""

    def __init__(self, model: nn.Module, tap_ids: list[int] | tuple[int, ...] = (), kernels=None, eval_every: int = 0):
        self.model = model
        # Where the layers, embedding and head sit never changes: found once, not on every drafted round.
        self._owner, self._parent, self._layers = find_layers(model)
        self.kernels = kernels  # KernelConfig for verify-width Metal kernels; None: plain MLX
        self.eval_every = eval_every  # start computing every n decoder layers (0: only at the end)
        self._sink = _Sink()
        self.set_taps(tap_ids)

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def _install(self, ids):
        layers = self._layers
        for i, layer in enumerate(layers):
            inner = layer.inner if isinstance(layer, LayerTap) else layer
            n = self.eval_every
            start = n > 0 and i % n == n - 1 and i < len(layers) - 1
            tap = self._sink if i in ids else None
            last = i == len(layers) - 1  # always wrapped: it can keep only the last rows (`__call__`'s `last`)
            layers[i] = LayerTap(inner, tap, start) if tap is not None or start or last else inner

    def set_taps(self, ids) -> None:
        n = self.num_layers
        for i in ids:
            if not 0 <= i < n:
                raise LoadError(f"tap layer {i} is out of range for a target with {n} layers")
        self.tap_ids = tuple(ids)
        self._install(self.tap_ids)

    def __call__(self, tokens: mx.array, cache, last: int | None = None) -> tuple[mx.array, mx.array | None]:
        """tokens [1, M] -> logits [1, M, V] (float32) and hidden [1, M, n_taps * H] (or None). last: only the
        last rows' logits are wanted (the others may be left out: read logits[:, -last:])."""
        self._sink.values.clear()
        self._layers[-1].keep = last
        try:
            logits = self.model(tokens, cache=cache)
        finally:
            self._layers[-1].keep = None
        hidden = mx.concatenate(self._sink.values, axis=-1) if self.tap_ids else None
        self._sink.values.clear()
        return logits.astype(mx.float32), hidden

    @cached_property
    def dtype(self) -> mx.Dtype:
        """The first parameter's dtype (a cost curve's key): asked by every request with the adaptive controller,
        and the walk over the parameters was most of what choosing its curve cost (0.2 of 0.3 ms)."""
        from mlx.utils import tree_flatten

        return tree_flatten(self.model.parameters())[0][1].dtype

    # The drafter borrows the target's embedding and LM head.
    @cached_property
    def _embedding(self) -> nn.Module:
        emb = _first(self._owner, EMBEDDINGS) or _first(self._parent, EMBEDDINGS)
        if emb is None:
            raise LoadError(f"cannot find the embedding of {self.model_type}")
        return emb

    @cached_property
    def _head(self):
        """The LM head (qwen3_5: under `language_model`; most: the model itself), or tied embeddings."""
        holder = next((m for m in (self._parent, self.model) if isinstance(m.get("lm_head"), nn.Module)), None)
        return holder["lm_head"] if holder is not None else self._embedding.as_linear

    def embed(self, tokens: mx.array) -> mx.array:
        emb = self._embedding
        h = emb(tokens)
        if self.model_type.startswith(("gemma", "gear")):  # gear scales its embeddings as gemma does
            h = h * mx.array(emb.weight.shape[-1] ** 0.5, h.dtype)
        return h

    def lm_head(self, h: mx.array) -> mx.array:
        return self._head(h)

    def check_speculation(self) -> None:
        """Refuse (at load) a target whose caches cannot roll back exactly; plain decoding needs no check."""
        from .engine.rollback import speculation_problem

        problem = speculation_problem(self.model)
        if problem:
            raise LoadError(f"speculative decoding is not supported on {problem}; load with drafter=None "
                            f"(--no-draft) for plain decoding")

    @property
    def model_type(self) -> str:
        return getattr(self.model, "model_type", "") or ""

    def check_taps(self, tokens: list[int]) -> None:
        """The tap on the last layer, through the final norm and head, must give the model's own choices.

        Argmax, not values: some heads add a monotonic soft-cap after the projection.
        """
        saved = self.tap_ids
        self.set_taps((self.num_layers - 1,))
        try:
            logits, hidden = self(mx.array([tokens]), cache=None)
            norm = _first(self._owner, FINAL_NORMS)
            if norm is None:
                return
            mine = self.lm_head(norm(hidden)).astype(mx.float32)
            if not mx.array_equal(mine.argmax(-1), logits.argmax(-1)).item():
                raise LoadError(f"hidden-state taps do not reproduce {self.model_type} logits; architecture not supported")
        finally:
            self.set_taps(saved)
