"""EAGLE-3 drafters (SpecForge / SGLang and vLLM / speculators layouts), chain drafting.

One Llama decoder layer whose attention reads [input_layernorm(emb(x_{t+1})) ; hidden_norm(g_t)]
(2H wide) with residual g_t; g_t = fc(three tapped target layers) on committed rows and the layer's
own previous output on chained steps. Its LM head covers a reduced draft vocabulary; draft id i is
target id i + d2t[i], so the proposal distribution q lives on those ids of the target vocabulary
and is zero elsewhere. speculators' variants normalise the taps before fc: `norm_before_fc` one
RMSNorm over the concatenation (`input_norm`, gpt-oss style), `fc_norm` one per tap (`fc_norm.{i}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from ..errors import DrafterMismatchError, LoadError
from ..model_files import check_safetensors, read_config, text_config
from .base import load_strict, parse_config
from .chain import ChainDrafter, causal_mask, quantize_like


@dataclass
class Eagle3Config:
    layer: dict  # the decoder layer's Llama settings (hidden_size, heads, rope, ...)
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    aux_ids: list[int] | None  # as written in the config (see `tap_layers`)
    norm_before_residual: bool = False
    norm_output: bool = False  # chained steps read the normed output (else the pre-norm one)
    norm_before_fc: bool = False  # RMSNorm(concat(taps)) before fc (`input_norm`)
    fc_norm: bool = False  # concat(RMSNorm_i(tap_i)) before fc (`fc_norm.{i}`)

    @classmethod
    def from_dict(cls, cfg: dict) -> "Eagle3Config":
        if cfg.get("speculators_model_type") == "eagle3":  # speculators: the layer's settings nested
            layer = dict(cfg["transformer_layer_config"])
            if cfg.get("norm_before_fc") and cfg.get("fc_norm"):
                raise LoadError("EAGLE-3 options norm_before_fc and fc_norm exclude each other (speculators)")
            aux = cfg.get("eagle_aux_hidden_state_layer_ids")
        else:  # SpecForge / SGLang: a LlamaForCausalLMEagle3 config
            layer = dict(cfg)
            aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        vocab = cfg.get("vocab_size") or layer["vocab_size"]
        return cls(layer=layer, vocab_size=vocab, draft_vocab_size=cfg.get("draft_vocab_size") or vocab,
                   target_hidden_size=cfg.get("target_hidden_size") or layer["hidden_size"],
                   aux_ids=list(aux) if aux else None,
                   norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                   norm_output=bool(cfg.get("norm_output", False)),
                   norm_before_fc=bool(cfg.get("norm_before_fc", False)), fc_norm=bool(cfg.get("fc_norm", False)))

    def tap_layers(self, n_layers: int) -> list[int]:
        """The target decoder layers whose outputs fc reads, in fc's order.

        SpecForge numbers layer outputs (default [1, N/2-1, N-4]); vLLM, speculators and mlx-vlm number
        HF hidden_states, i.e. layer inputs (default [2, N/2, N-3]). As SGLang does, ids starting at 1
        are taken as layer outputs and any others as hidden_states indices (one more than the layer).
        """
        if self.aux_ids is None:
            return [1, n_layers // 2 - 1, n_layers - 4]
        return list(self.aux_ids) if self.aux_ids[0] == 1 else [i - 1 for i in self.aux_ids]


class Eagle3Layer(nn.Module):
    def __init__(self, args: llama.ModelArgs, norm_before_residual: bool):
        super().__init__()
        h, bias = args.hidden_size, args.attention_bias
        self.self_attn = attn = llama.Attention(args)
        # Queries, keys and values read [embedding ; hidden]: twice the layer's width.
        attn.q_proj = nn.Linear(2 * h, attn.n_heads * attn.head_dim, bias=bias)
        attn.k_proj = nn.Linear(2 * h, attn.n_kv_heads * attn.head_dim, bias=bias)
        attn.v_proj = nn.Linear(2 * h, attn.n_kv_heads * attn.head_dim, bias=bias)
        self.mlp = llama.MLP(args)
        self.input_layernorm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def __call__(self, emb: mx.array, g: mx.array, mask, cache) -> mx.array:
        normed = self.hidden_norm(g)
        x = mx.concatenate([self.input_layernorm(emb), normed.astype(emb.dtype)], axis=-1)
        h = (normed if self.norm_before_residual else g) + self.self_attn(x, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Model(nn.Module):
    """The checkpoint's modules under their SpecForge names."""

    def __init__(self, cfg: Eagle3Config, own_embedding: bool):
        super().__init__()
        args = llama.ModelArgs.from_dict({"model_type": "llama", "num_hidden_layers": 1, **cfg.layer,
                                          "vocab_size": cfg.vocab_size})
        h, ht = args.hidden_size, cfg.target_hidden_size
        if cfg.norm_before_fc:
            self.input_norm = nn.RMSNorm(3 * ht, eps=args.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = [nn.RMSNorm(ht, eps=args.rms_norm_eps) for _ in range(3)]
        self.fc = nn.Linear(3 * ht, h, bias=False)
        self.midlayer = Eagle3Layer(args, cfg.norm_before_residual)
        self.norm = nn.RMSNorm(h, eps=args.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        if own_embedding:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, h)


class _Ids:
    """Draft id -> target id (not a module parameter)."""

    def __init__(self, ids: mx.array | None):
        self.ids = ids


class Eagle3Drafter(ChainDrafter):
    def __init__(self, model: Eagle3Model, cfg: Eagle3Config, taps: list[int], target, d2t: mx.array | None,
                 block_size: int = 8):
        self.model, self.config, self._target = model, cfg, target
        self.block_size = block_size
        self.tap_ids = tuple(sorted(set(taps)))
        # The target returns taps in layer order, once each; fc reads them in the config's order.
        order = [self.tap_ids.index(t) for t in taps]
        self._order = None if order == list(range(len(self.tap_ids))) else order
        self._map = _Ids(None if d2t is None else mx.arange(d2t.shape[0], dtype=mx.int32) + d2t.astype(mx.int32))

    def features(self, hidden: mx.array) -> mx.array:
        m = self.model
        if self._order is not None or "fc_norm" in m:
            parts = mx.split(hidden, len(self.tap_ids), axis=-1)
            parts = [parts[i] for i in self._order] if self._order is not None else parts
            if "fc_norm" in m:
                parts = [norm(x) for norm, x in zip(m.fc_norm, parts)]
            hidden = mx.concatenate(parts, axis=-1)
        if "input_norm" in m:
            hidden = m.input_norm(hidden)
        return m.fc(hidden)

    def embed(self, tokens: mx.array) -> mx.array:
        return self.model.embed_tokens(tokens) if "embed_tokens" in self.model else self._target.embed(tokens)

    def step(self, g: mx.array, tokens: mx.array, cache) -> mx.array:
        emb = self.embed(tokens)
        return self.model.midlayer(emb, g, causal_mask(emb, cache), cache)

    def _draft_logits(self, out: mx.array) -> mx.array:
        return self.model.lm_head(self.model.norm(out))[0].astype(mx.float32)

    def logits(self, out: mx.array) -> mx.array:
        d = self._draft_logits(out)
        ids = self._map.ids
        if ids is None:
            return d
        full = mx.full((d.shape[0], self.config.vocab_size), -mx.inf, dtype=mx.float32)
        return mx.put_along_axis(full, mx.broadcast_to(ids[None], d.shape), d, axis=-1)

    def greedy_tokens(self, out: mx.array) -> mx.array:
        best = self._draft_logits(out).argmax(-1)
        return best.astype(mx.int32) if self._map.ids is None else self._map.ids[best]

    def feedback(self, out: mx.array) -> mx.array:
        return self.model.norm(out) if self.config.norm_output else out


def is_eagle3(cfg: dict, weight_names: set[str]) -> bool:
    archs = " ".join(cfg.get("architectures") or [])
    return ("Eagle3" in archs or cfg.get("speculators_model_type") == "eagle3"
            or "d2t" in weight_names or any(w.startswith("midlayer.") for w in weight_names))


def _rename(name: str) -> str | None:
    """A checkpoint tensor's name in Eagle3Model (None: not ours)."""
    if name.startswith(("verifier_", "t2d")):
        return None
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):  # vLLM / speculators
        name = "midlayer." + name[len("layers.0."):]
    return name


def load_eagle3(path: Path, target, target_config: dict, block_size: int | None = None) -> Eagle3Drafter:
    raw = read_config(path)
    weights = {}
    for f in check_safetensors(path):
        weights.update(mx.load(str(f)))
    weights = {new: v for k, v in weights.items() if (new := _rename(k)) is not None}
    d2t = weights.pop("d2t", None)
    cfg = parse_config(Eagle3Config, raw, path)
    taps = cfg.tap_layers(target.num_layers)
    check_fit(cfg, taps, d2t, "embed_tokens.weight" in weights, target, target_config, path)
    model = Eagle3Model(cfg, own_embedding="embed_tokens.weight" in weights)
    if cfg.norm_before_fc and "input_norm.weight" not in weights:  # speculators loads it as optional: ones
        weights["input_norm.weight"] = model.input_norm.weight
    quantize_like(model, weights)
    load_strict(model, weights, path)
    return Eagle3Drafter(model, cfg, taps, target, d2t, block_size or 8)


def check_fit(cfg: Eagle3Config, taps: list[int], d2t, own_embedding: bool, target, target_config: dict,
              path: Path) -> None:
    tcfg = text_config(target_config)
    hidden, vocab, n = tcfg.get("hidden_size"), tcfg.get("vocab_size"), target.num_layers
    problems = []
    if hidden is not None and cfg.target_hidden_size != hidden:
        problems.append(f"reads hidden states of size {cfg.target_hidden_size}, the target's are {hidden}")
    if hidden is not None and not own_embedding and cfg.layer["hidden_size"] != hidden:
        problems.append(f"hidden size {cfg.layer['hidden_size']} != target's {hidden} and no embed_tokens of its own")
    if vocab is not None and cfg.vocab_size != vocab:
        problems.append(f"vocabulary {cfg.vocab_size} != target's {vocab}")
    if len(taps) != 3:
        problems.append(f"{len(taps)} aux hidden-state layers, EAGLE-3 reads 3")
    bad = [i for i in taps if not 0 <= i < n]
    if bad:
        problems.append(f"aux hidden-state layers {bad} (as layer outputs) out of range for a {n}-layer target")
    if d2t is None and cfg.draft_vocab_size != cfg.vocab_size:
        problems.append(f"draft vocabulary {cfg.draft_vocab_size} != {cfg.vocab_size} but no d2t id map")
    if d2t is not None:
        if d2t.shape != (cfg.draft_vocab_size,):
            problems.append(f"d2t has shape {tuple(d2t.shape)}, expected ({cfg.draft_vocab_size},)")
        else:
            ids = mx.arange(cfg.draft_vocab_size) + d2t.astype(mx.int64)
            if not (ids.min().item() >= 0 and ids.max().item() < cfg.vocab_size):
                problems.append("d2t maps draft ids outside the target's vocabulary")
    if problems:
        raise DrafterMismatchError(f"EAGLE-3 drafter {path} does not fit the target: " + "; ".join(problems))
