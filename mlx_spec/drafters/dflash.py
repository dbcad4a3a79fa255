"""DFlash block-diffusion drafter (z-lab format): one pass drafts a whole block.

The drafter has no embedding or LM head of its own; it borrows the target's. Target
hidden states from `target_layer_ids` are fused (fc + RMSNorm) into context rows that
every layer sees as extra keys/values; the block [anchor, MASK x (B-1)] attends to that
context and bidirectionally to itself. Slot k predicts the token at position start + k.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.qwen3 import MLP
from mlx_lm.models.rope_utils import initialize_rope

from .. import cpu_attention
from ..errors import DrafterMismatchError, LoadError
from ..model_files import check_safetensors, read_config
from .base import Draft, load_strict, parse_config
from .context import DFlashState, batch_context, last_rows, write_rows


@dataclass
class DFlashConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    block_size: int = 16
    # the shorter blocks it also learnt to draft from (mlx-spec's `train-drafter --sub-blocks`), with block_size:
    # a short draft runs the smallest that holds it (None: always the whole block, as trained)
    block_sizes: list[int] | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960
    num_target_layers: int | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    is_causal: bool | None = None
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    quantization: dict | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, cfg: dict) -> "DFlashConfig":
        d = dict(cfg.get("dflash_config") or {})
        rope = cfg.get("rope_parameters") or {}
        n = cfg["num_hidden_layers"]
        taps = d.get("target_layer_ids")
        n_target = cfg.get("num_target_layers")
        if taps is None:
            if n_target is None:
                raise LoadError("drafter config has neither target_layer_ids nor num_target_layers")
            taps = [n_target // 2] if n == 1 else [round(1 + i * (n_target - 4) / (n - 1)) for i in range(n)]
        block = d.get("block_size") or cfg.get("block_size") or 16
        sizes = d.get("block_sizes")
        fits = isinstance(sizes, list) and all(type(b) is int and 2 <= b <= block for b in sizes)
        if sizes is not None and not fits:
            raise LoadError(f"drafter config's block_sizes must list block sizes from 2 to its block_size ({block}), "
                            f"got {sizes!r}")
        return cls(
            hidden_size=cfg["hidden_size"], num_hidden_layers=n,
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
            mask_token_id=d.get("mask_token_id", cfg.get("mask_token_id")),
            target_layer_ids=list(taps),
            block_size=block, block_sizes=sizes,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta") or rope.get("rope_theta") or 1_000_000.0,
            rope_scaling=cfg.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None),
            max_position_embeddings=cfg.get("max_position_embeddings", 40960),
            num_target_layers=n_target, layer_types=cfg.get("layer_types"),
            sliding_window=cfg.get("sliding_window"), is_causal=cfg.get("is_causal"),
            attention_bias=cfg.get("attention_bias", False),
            input_embedding_scale=d.get("input_embedding_scale", 1.0),
            output_multiplier=d.get("output_multiplier", 1.0),
            final_logit_softcapping=d.get("final_logit_softcapping"),
            quantization=cfg.get("quantization"),
        )

    def rows_for(self, drafts: int) -> int:
        """Rows of the block that drafts this many: the smallest block it learnt that holds them."""
        return next((b for b in sorted(self.block_sizes or ()) if b > drafts), self.block_size)

    def window(self, i: int) -> int | None:
        """Sliding-window size of layer i (None for full attention)."""
        if self.layer_types and self.layer_types[i] == "sliding_attention":
            return self.sliding_window
        return None

    def causal(self, i: int) -> bool:
        return self.is_causal if self.is_causal is not None else self.window(i) is not None


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        h, nh, nkv, hd, bias = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias
        self.n_heads, self.n_kv_heads, self.scale = nh, nkv, hd**-0.5
        self.q_proj = nn.Linear(h, nh * hd, bias=bias)
        self.k_proj = nn.Linear(h, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(h, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(hd, cfg.rope_theta, False, cfg.rope_scaling, cfg.max_position_embeddings)

    def _heads(self, x, n):
        B, L, _ = x.shape
        return x.reshape(B, L, n, -1).transpose(0, 2, 1, 3)

    def context_kv(self, ctx: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        """Keys/values of context rows at absolute positions offset, offset+1, ..."""
        k = self.rope(self.k_norm(self._heads(self.k_proj(ctx), self.n_kv_heads)), offset=offset)
        return k, self._heads(self.v_proj(ctx), self.n_kv_heads)

    def __call__(self, x, ctx_kv, start, window: int | None, causal: bool, ctx_mask=None, block_mask=None):
        """x: [n, L, H] blocks starting at `start` (int, or [n] array: many blocks, each at its own place).
        ctx_kv: context keys/values, batch 1 (shared by all blocks) or n; ctx_mask: optional
        [n, 1, 1, S] visibility of context rows per block (training: rows before each anchor; batched
        drafting: each request's own rows); block_mask: optional [n, 1, 1, L] visibility of the block's
        own rows (training shorter blocks inside longer ones: the rows a short block lacks).
        """
        n, L, _ = x.shape
        q = self.rope(self.q_norm(self._heads(self.q_proj(x), self.n_heads)), offset=start)
        k = self.rope(self.k_norm(self._heads(self.k_proj(x), self.n_kv_heads)), offset=start)
        v = self._heads(self.v_proj(x), self.n_kv_heads)
        ck, cv = ctx_kv
        n_ctx = 0
        if ck is not None:
            if window is not None:
                ck, cv = last_rows(ck, window - 1), last_rows(cv, window - 1)
            n_ctx = ck.shape[2]
            if ck.shape[0] != n:
                ck, cv = (mx.broadcast_to(a, (n,) + a.shape[1:]) for a in (ck, cv))
            k, v = mx.concatenate([ck, k], axis=2), mx.concatenate([cv, v], axis=2)
        mask = None
        if causal or ctx_mask is not None or block_mask is not None:
            block = mx.arange(L)[None] <= mx.arange(L)[:, None] if causal else mx.ones((L, L), mx.bool_)
            if block_mask is not None:
                block = block & block_mask
            ctx = ctx_mask if ctx_mask is not None else mx.ones((1, 1, 1, n_ctx), mx.bool_)
            rows = max(ctx.shape[0], block.shape[0] if block.ndim == 4 else 1)
            mask = mx.concatenate([mx.broadcast_to(ctx, (rows, 1, L, n_ctx)),
                                   mx.broadcast_to(block, (rows, 1, L, L))], axis=-1)
        out = cpu_attention.sdpa(q, k, v, scale=self.scale, mask=mask)  # (mx.fast's, but on x86 CPUs at long context)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(n, L, -1))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x, ctx_kv, start, window, causal, ctx_mask=None, block_mask=None):
        h = x + self.self_attn(self.input_layernorm(x), ctx_kv, start, window, causal, ctx_mask, block_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        n_taps = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self._target = None  # borrowed embedding and head; not a parameter of ours

    # --- the Drafter interface -------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def tap_ids(self) -> tuple[int, ...]:
        return tuple(self.config.target_layer_ids)

    def bind(self, target) -> "DFlashDrafter":
        self._target = target
        return self

    def make_state(self) -> DFlashState:
        return DFlashState(len(self.layers))

    def context_spans(self, state: DFlashState) -> list[int]:
        return [self.config.window(i) or 0 for i in range(len(self.layers))]

    def observe(self, state: DFlashState, hidden: mx.array, tokens: list[int]) -> None:
        ctx = self.hidden_norm(self.fc(hidden))
        for layer, cache in zip(self.layers, state.caches):
            cache.update_and_fetch(*layer.self_attn.context_kv(ctx, cache.offset))

    def observe_batch(self, states: list[DFlashState], hidden: mx.array, tokens: list[list[int]]) -> None:
        """`observe` for several requests about to draft together: their new rows [B, n, taps*H], request b's
        first len(tokens[b]) of them (padding after), in one pass and one scatter a layer (context.py)."""
        counts = [len(t) for t in tokens]
        ctx = self.hidden_norm(self.fc(hidden))
        starts = mx.array([s.offset for s in states])
        for i, layer in enumerate(self.layers):
            keys, values = layer.self_attn.context_kv(ctx, starts)
            write_rows(states, i, keys, values, counts)

    first_slot = 1  # the anchor's row is never a draft: skipped before the LM head (vocab-wide, the costliest part)

    def propose(self, state: DFlashState, anchor: int, k: int, sampling) -> Draft:
        # A block the drafter was trained on, however few of its drafts are wanted: a shorter block of mask
        # slots is outside what it learnt (drafts of 3 from 4 slots were accepted at τ 2.87, first slot 0.73;
        # cut from the whole 8-slot block at τ 3.10, 0.82), unless it learnt that size too (`rows_for`).
        h = self.block_hidden(state, anchor, self.config.rows_for(k))[0, self.first_slot : self.first_slot + k]
        return self.draft_from(h, self.slot_logits(h), anchor, k, sampling)

    def propose_batch(self, states: list, anchors: list[int], ks: list[int], samplings: list) -> list[Draft]:
        """Several requests' drafts from one drafter pass and one LM-head product (each block over its
        own context): what a batched verify round needs, for little more than one request's pass."""
        top = max(ks)
        h = self.blocks_hidden(states, anchors, self.config.rows_for(top))[:, self.first_slot : self.first_slot + top]
        logits = self.slot_logits(h)
        return [self.draft_from(h[i, :k], logits[i, :k], a, k, s)
                for i, (a, k, s) in enumerate(zip(anchors, ks, samplings))]

    # --- the model ---------------------------------------------------------------
    def slot_logits(self, h: mx.array) -> mx.array:
        return self.head_logits(h)

    def draft_from(self, h: mx.array, logits: mx.array, anchor: int, k: int, sampling) -> Draft:
        """The draft from one block's drafting rows: their final hidden states h and logits [k, V]."""
        if sampling.greedy:
            return Draft(logits.argmax(-1).astype(mx.int32))
        q = sampling.probs(logits)
        return Draft(sampling.draw(q), q)

    def embed_block(self, ids: mx.array) -> mx.array:
        h = self._target.embed(ids)
        return h * self.config.input_embedding_scale if self.config.input_embedding_scale != 1.0 else h

    def block_logits(self, state: DFlashState, anchor: int, n_slots: int) -> mx.array:
        return self.head_logits(self.block_hidden(state, anchor, n_slots))

    def block_hidden(self, state: DFlashState, anchor: int, n_slots: int) -> mx.array:
        """The block's rows after the final norm (what the LM head reads)."""
        cfg = self.config
        h = self.embed_block(mx.array([[anchor] + [cfg.mask_token_id] * (n_slots - 1)]))
        start = state.offset
        for i, layer in enumerate(self.layers):
            h = layer(h, state.kv(i), start, cfg.window(i), cfg.causal(i))
        return self.norm(h)

    def blocks_hidden(self, states: list, anchors: list[int], width: int | None = None) -> mx.array:
        """`block_hidden` of several requests' blocks (of `width` rows; None: whole) in one pass, [n, width, H]:
        each block at its own position over its own context rows (padded to the longest, masked)."""
        cfg, width = self.config, width or self.config.block_size
        h = self.embed_block(mx.array([[a] + [cfg.mask_token_id] * (width - 1) for a in anchors]))
        starts = mx.array([s.offset for s in states])
        for i, layer in enumerate(self.layers):
            ctx_kv, ctx_mask = batch_context(states, i, cfg.window(i))
            h = layer(h, ctx_kv, starts, None, cfg.causal(i), ctx_mask)
        return self.norm(h)

    def head_logits(self, h: mx.array) -> mx.array:
        """The target's LM head over drafter rows, with the checkpoint's multiplier and softcap."""
        cfg = self.config
        logits = self._target.lm_head(h).astype(mx.float32) * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            cap = cfg.final_logit_softcapping
            logits = mx.tanh(logits / cap) * cap
        return logits

    def sanitize(self, weights: dict) -> dict:
        renames = {"encoder.fc.": "fc.", "encoder.output_norm_enc.": "hidden_norm.", "model.": ""}
        out = {}
        for k, v in weights.items():
            for old, new in renames.items():
                if k.startswith(old):
                    k = new + k[len(old):]
            out[k] = v
        return out


def detect_kind(cfg: dict, weight_names: set[str]) -> str:
    """Tell drafter formats apart by content, not by folder name."""
    archs = " ".join(cfg.get("architectures") or [])
    if "DFlash2" in archs or any("candidate_selector" in w for w in weight_names):
        return "dflash2"
    if "DSpark" in archs or any(w.startswith("markov_head") for w in weight_names):
        return "dspark"
    from .eagle3 import is_eagle3
    from .mtp import is_mtp_only

    if is_eagle3(cfg, weight_names):  # before DFlash: EAGLE-3 has an fc.weight too
        return "eagle3"
    if is_mtp_only(cfg, weight_names):
        return "mtp"
    if "dflash_config" in cfg or "DFlash" in archs or "fc.weight" in weight_names:
        return "dflash"
    # the embedding's name: most `embed_tokens`; nemotron_h `backbone.embeddings`; bailing `word_embeddings`
    if "model_type" in cfg and any(n in w for w in weight_names for n in ("embed_tokens", ".embeddings.", "word_embeddings")):
        return "lm"
    return "unknown"


def load_dflash(path: Path, target, target_config: dict) -> DFlashDrafter:
    """Load a DFlash drafter folder and check that it fits `target` (a `Target`)."""
    raw = read_config(path)
    weights = read_weights(path)
    kind = detect_kind(raw, set(weights))
    if kind != "dflash":
        hint = {
            "dflash2": "a DFlash 2 drafter, not a DFlash one (load it with --mode dflash2 or auto)",
            "dspark": "a DSpark drafter, not a DFlash one (load it with --mode dspark or auto)",
            "lm": "a plain language model, not a DFlash drafter",
            "eagle3": "an EAGLE-3 drafter, not a DFlash one (load it with --mode eagle3 or auto)",
            "mtp": "an MTP head, not a DFlash drafter (load it with --mode mtp or auto)",
        }.get(kind, "not a DFlash drafter")
        raise DrafterMismatchError(f"{path} is {hint}")
    cfg = parse_config(DFlashConfig, raw, path)
    check_fit(cfg, target, target_config, path)
    return fill(DFlashDrafter(cfg), weights, path).bind(target)


def read_weights(path: Path) -> dict:
    weights = {}
    for f in check_safetensors(path):
        weights.update(mx.load(str(f)))
    return weights


def fill(model: DFlashDrafter, weights: dict, path: Path) -> DFlashDrafter:
    """Load checkpoint weights into a DFlash-family drafter (quantized where the file is)."""
    cfg = model.config
    weights = model.sanitize(weights)
    if cfg.quantization:
        q = cfg.quantization
        nn.quantize(model, group_size=q["group_size"], bits=q["bits"],
                    class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights)
    for name in [w for w in weights if w.startswith(("lm_head", "embed_tokens"))]:
        weights.pop(name)  # tolerated copies of the target's own; the target's are used
    load_strict(model, weights, path)
    fc_in = model.fc.weight.shape[-1] * (32 // cfg.quantization["bits"] if cfg.quantization else 1)
    if fc_in != len(cfg.target_layer_ids) * cfg.hidden_size:
        raise DrafterMismatchError(f"{path}: fc takes {fc_in} features, expected {len(cfg.target_layer_ids)} taps x {cfg.hidden_size}")
    return model


def check_fit(cfg: DFlashConfig, target, target_config: dict, path: Path) -> None:
    tcfg = target_config.get("text_config", target_config)
    hidden, vocab, n_layers = tcfg.get("hidden_size"), tcfg.get("vocab_size"), target.num_layers
    problems = []
    if hidden is not None and cfg.hidden_size != hidden:
        problems.append(f"hidden size {cfg.hidden_size} != target's {hidden}")
    if vocab is not None and cfg.vocab_size != vocab:
        problems.append(f"vocabulary {cfg.vocab_size} != target's {vocab}")
    if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < (vocab or cfg.vocab_size):
        problems.append(f"mask_token_id {cfg.mask_token_id} is not a token of the target")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < n_layers]
    if bad:
        problems.append(f"target_layer_ids {bad} out of range for a {n_layers}-layer target")
    if cfg.num_target_layers is not None and cfg.num_target_layers != n_layers:
        problems.append(f"trained for a {cfg.num_target_layers}-layer target, this one has {n_layers}")
    if problems:
        raise DrafterMismatchError(f"drafter {path} does not fit the target: " + "; ".join(problems))


def save_dflash(model: DFlashDrafter, out: Path, extra_config: dict | None = None) -> Path:
    """Write a drafter folder in the public DFlash format."""
    from mlx.utils import tree_flatten

    cfg = model.config
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings, "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size, "attention_bias": cfg.attention_bias, "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.target_layer_ids,
                          "block_size": cfg.block_size},
        **(extra_config or {}),
    }
    if cfg.block_sizes and cfg.block_sizes != [cfg.block_size]:  # (a key other DFlash loaders pass over)
        config["dflash_config"]["block_sizes"] = list(cfg.block_sizes)
    if cfg.layer_types:  # a sliding-window drafter: its context window must survive the round trip
        config.update(layer_types=cfg.layer_types, sliding_window=cfg.sliding_window, is_causal=cfg.is_causal)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = {k: v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out
