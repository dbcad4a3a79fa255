"""DFlash 2 drafter (z-lab format): DFlash plus a dynamic convolution around every sublayer and a
candidate selector that makes the block's drafts depend on each other.

Everything else (context fusion, the context cache, attention, the borrowed embedding and LM head)
is DFlash's and imported from dflash.py. Both additions are block-local, so the drafter's state
is DFlash's context cache alone and rolls back the same way (`trim`).

- Conv: each attention / MLP sublayer input n = norm(x) yields per-position kernels
  d = kernel_projection(n) (one value per channel group and tap); the sublayer becomes
  conv_out(f(conv_in(n))) with conv(u)[t] = sum_j (base[j] + d[t, j, group]) * u[t - j],
  zero before slot 0.
- Selector: slot j keeps the top-k LM-head candidates and scores each as
  logit(c) + sum(P[pred] * (W h_j) * S[c]) given the token drawn before it (the anchor first);
  the walk takes the argmax, or samples from the candidates' distribution, so q is k-sparse and
  conditioned on the predecessor actually drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import DrafterMismatchError
from ..model_files import read_config
from .base import Draft, parse_config
from .dflash import DFlashConfig, DFlashDrafter, DFlashLayer, check_fit, detect_kind, fill, read_weights


@dataclass
class DFlash2Config(DFlashConfig):
    conv_kernel_size: int = 2
    conv_group_size: int = 16  # channels per group: kernel_projection gives H / group values per tap
    selector_rank: int = 256
    selector_top_k: int = 16

    @classmethod
    def from_dict(cls, cfg: dict) -> "DFlash2Config":
        out = super().from_dict(cfg)  # cls(...) builds a DFlash2Config with the defaults above
        d = cfg.get("dflash_config") or {}
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            if key in d:
                setattr(out, key, int(d[key]))
        return out


class DynamicConv(nn.Module):
    """A pair of grouped causal convolutions over the block (into and out of one sublayer) whose
    kernels are a learned base plus a per-position correction projected from the sublayer input."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        self.base_kernel = mx.zeros((2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)

    def kernels(self, n: mx.array) -> mx.array:
        """[B, L, 2, K, groups]: index 0 for the input conv, 1 for the output conv."""
        return self.kernel_projection(n).reshape(*n.shape[:-1], 2, self.kernel, n.shape[-1] // self.group)

    def __call__(self, u: mx.array, dynamic: mx.array, which: int) -> mx.array:
        B, L, H = u.shape
        g = H // self.group
        blocks = u.reshape(B, L, g, self.group)
        base = self.base_kernel[which].reshape(self.kernel, g, self.group).astype(u.dtype)
        out = mx.zeros_like(blocks)
        for j in range(self.kernel):
            shifted = blocks if j == 0 else mx.concatenate([mx.zeros_like(blocks[:, :j]), blocks[:, :-j]], axis=1)
            out = out + (base[j] + dynamic[:, :, which, j, :, None]) * shifted
        return out.reshape(B, L, H)


class DFlash2Layer(DFlashLayer):
    def __init__(self, cfg: DFlash2Config):
        super().__init__(cfg)
        self.attention_conv = DynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.mlp_conv = DynamicConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def __call__(self, x, ctx_kv, start, window, causal, ctx_mask=None, block_mask=None):
        n = self.input_layernorm(x)
        d = self.attention_conv.kernels(n)
        a = self.self_attn(self.attention_conv(n, d, 0), ctx_kv, start, window, causal, ctx_mask, block_mask)
        h = x + self.attention_conv(a, d, 1)
        n = self.post_attention_layernorm(h)
        d = self.mlp_conv.kernels(n)
        return h + self.mlp_conv(self.mlp(self.mlp_conv(n, d, 0)), d, 1)


class CandidateSelector(nn.Module):
    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)
        self.predecessor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
        self.successor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)

    def walk(self, h: mx.array, logits: mx.array, anchor: int, sampling) -> Draft:
        """h, logits: [k, H], [k, V] of the drafting slots. Drafts left to right from the anchor."""
        cands = mx.argpartition(logits, -self.top_k, axis=-1)[:, -self.top_k:]  # [k, top_k]
        unary = mx.take_along_axis(logits, cands, axis=-1)
        proj = self.hidden_projection(h)  # [k, r]
        succ = self.successor_codebook(cands)  # [k, top_k, r]
        pred, tokens, qs = mx.array([anchor]), [], []
        for j in range(h.shape[0]):
            edge = (self.predecessor_codebook(pred) * proj[j : j + 1]) @ succ[j].T  # [1, top_k]
            scores = (unary[j : j + 1] + edge).astype(mx.float32)
            if sampling.greedy:
                pick = scores.argmax(-1)
                pred = cands[j][pick]
            else:
                # The candidates' law under the request's temperature (and truncation), spread over the
                # vocabulary with zeros elsewhere: exactly the law the draft is drawn from.
                row = mx.full((1, logits.shape[-1]), -mx.inf, mx.float32)
                row = mx.put_along_axis(row, cands[j : j + 1], scores, axis=-1)
                qs.append(sampling.probs(row))
                pred = sampling.draw(qs[-1])
            tokens.append(pred.astype(mx.int32))
        if not tokens:
            return Draft(mx.zeros((0,), mx.int32))
        return Draft(mx.concatenate(tokens), mx.concatenate(qs) if qs else None)


class DFlash2Drafter(DFlashDrafter):
    def __init__(self, cfg: DFlash2Config):
        super().__init__(cfg)
        self.layers = [DFlash2Layer(cfg) for _ in range(cfg.num_hidden_layers)]
        self.candidate_selector = CandidateSelector(cfg)

    def draft_from(self, h: mx.array, logits: mx.array, anchor: int, k: int, sampling) -> Draft:
        return self.candidate_selector.walk(h, logits, anchor, sampling)

    def sanitize(self, weights: dict) -> dict:
        out = super().sanitize(weights)
        for name in ("predecessor_codebook", "successor_codebook"):
            key = f"candidate_selector.{name}"
            if key in out:  # the public files store the codebooks without a .weight suffix
                out[f"{key}.weight"] = out.pop(key)
        return out


def load_dflash2(path: Path, target, target_config: dict) -> DFlash2Drafter:
    raw = read_config(path)
    weights = read_weights(path)
    kind = detect_kind(raw, set(weights))
    if kind != "dflash2":
        raise DrafterMismatchError(f"{path} is not a DFlash 2 drafter (it reads as {kind}; try --mode auto)")
    cfg = parse_config(DFlash2Config, raw, path)
    check_fit(cfg, target, target_config, path)
    problems = []
    if cfg.conv_group_size <= 0 or cfg.hidden_size % cfg.conv_group_size:
        problems.append(f"conv_group_size {cfg.conv_group_size} does not divide hidden size {cfg.hidden_size}")
    if not 0 < cfg.selector_top_k <= cfg.vocab_size:
        problems.append(f"selector_top_k {cfg.selector_top_k} is not in 1..{cfg.vocab_size}")
    if problems:
        raise DrafterMismatchError(f"{path}: " + "; ".join(problems))
    return fill(DFlash2Drafter(cfg), weights, path).bind(target)
