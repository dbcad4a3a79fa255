"""DSpark drafter (DeepSeek, DeepSpec format): a DFlash-style backbone plus a Markov head.

Differences from DFlash that matter for correctness:
- the anchor slot itself predicts: a block [anchor, MASK x (B-1)] gives B drafts (slot k
  predicts position start + k + 1), so the verify pass has B + 1 rows;
- it carries its own frozen copies of the target's embedding and LM head;
- drafts are drawn left to right: logits_k = U_k + W2(W1[x_{k-1}]) (x_0 = the anchor), so q_k
  is conditioned on the token actually drawn before it;
- a confidence head c_k = sigmoid(proj([h_k ; W1[x_{k-1}]])) lets the draft stop early: where the
  survival product prod c_i falls below a threshold (the paper's scheduler, mlx-dspark), or with
  `confidence_rule: "step"` where c_k itself does (DeepSpec's evaluator).

Markov heads (DeepSpec `markov_head_type`), e = W1[x_{k-1}], h_k the slot's post-norm row:
- vanilla: bias = W2(e);
- gated: bias = W2(sigmoid(gate_proj([h_k ; e])) * e);
- rnn: [g, c, o] = joint_proj([s_{k-1} ; e ; h_k]), s_k = sigmoid(g) s_{k-1} + (1 - sigmoid(g)) tanh(c),
  bias = W2(tanh(o)), with s_0 = 0 in every block: its state never outlives a block, so rollback
  is still DFlash's context cache alone.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import LoadError
from ..model_files import check_safetensors, read_config
from .base import Draft, load_strict, parse_config
from .dflash import DFlashConfig, DFlashDrafter, check_fit


class MarkovHead(nn.Module):
    """The vanilla head; `step` gives one slot's logit bias and the head's state after it."""

    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def start(self):
        return None

    def step(self, state, e: mx.array, h: mx.array):
        return state, self.markov_w2(e)


class GatedMarkovHead(MarkovHead):
    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__(vocab, rank, hidden)
        self.gate_proj = nn.Linear(hidden + rank, rank)

    def step(self, state, e, h):
        gate = mx.sigmoid(self.gate_proj(mx.concatenate([h, e.astype(h.dtype)], -1)))
        return state, self.markov_w2(gate.astype(e.dtype) * e)


class RNNHead(MarkovHead):
    def __init__(self, vocab: int, rank: int, hidden: int):
        super().__init__(vocab, rank, hidden)
        self.rank = rank
        self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def start(self):
        return mx.zeros((1, self.rank))

    def step(self, state, e, h):
        g, c, o = mx.split(self.joint_proj(mx.concatenate([state.astype(h.dtype), e.astype(h.dtype), h], -1)), 3, -1)
        g = mx.sigmoid(g)
        return g * state + (1 - g) * mx.tanh(c), self.markov_w2(mx.tanh(o))


HEADS = {"vanilla": MarkovHead, "gated": GatedMarkovHead, "rnn": RNNHead}


class ConfidenceHead(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.proj = nn.Linear(dims, 1)


class DSparkDrafter(DFlashDrafter):
    def __init__(self, cfg: DFlashConfig, rank: int, confidence: bool, with_markov: bool, threshold: float,
                 logits_start: int = 0, head: str = "vanilla", rule: str = "survival"):
        super().__init__(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.markov_head = HEADS[head](cfg.vocab_size, rank, cfg.hidden_size)
        self.rule = rule
        if confidence:
            self.confidence_head = ConfidenceHead(cfg.hidden_size + (rank if with_markov else 0))
        self.with_markov, self.threshold, self.logits_start = with_markov, threshold, logits_start
        self.embed_scale = cfg.hidden_size**0.5 if cfg.extra.get("gemma") else 1.0

    @property
    def max_drafts(self) -> int:
        return self.config.block_size - self.logits_start

    @property
    def block_size(self) -> int:  # verify width: the anchor plus every slot's draft
        return self.max_drafts + 1

    @property
    def first_slot(self) -> int:
        return self.logits_start

    def slot_logits(self, h: mx.array) -> mx.array:  # its own LM head, not the target's
        return self.lm_head(h).astype(mx.float32)

    def draft_from(self, h: mx.array, base: mx.array, anchor: int, k: int, sampling) -> Draft:
        k = min(k, self.max_drafts)
        head = self.markov_head
        prev, tokens, qs, conf, s = mx.array([anchor]), [], [], [], head.start()
        for j in range(k):
            m = head.markov_w1(prev)  # [1, rank]
            s, bias = head.step(s, m, h[j : j + 1])
            logits = base[j : j + 1] + bias.astype(mx.float32)
            if sampling.greedy:
                prev = logits.argmax(-1).astype(mx.int32)
            else:
                qs.append(sampling.probs(logits))
                prev = sampling.draw(qs[-1])
            tokens.append(prev)
            if "confidence_head" in self:
                feats = mx.concatenate([h[j : j + 1], m.astype(h.dtype)], -1) if self.with_markov else h[j : j + 1]
                conf.append(mx.sigmoid(self.confidence_head.proj(feats))[0, 0])
        tokens = mx.concatenate(tokens) if tokens else mx.zeros((0,), mx.int32)
        n = self._keep(conf) if conf and self.threshold > 0 else k
        return Draft(tokens[:n], mx.concatenate(qs)[:n] if qs else None)

    def _keep(self, conf: list[mx.array]) -> int:
        """Drafts up to the first position where the survival product (or, rule "step", the position's
        own confidence) falls below the threshold."""
        c = mx.stack(conf)
        score = (c if self.rule == "step" else mx.cumprod(c)).tolist()
        return next((i for i, s in enumerate(score) if s < self.threshold), len(score))

    def embed_block(self, ids: mx.array) -> mx.array:  # DSpark drafters carry their own embedding
        return self.embed_tokens(ids) * self.embed_scale


def load_dspark(path: Path, target, target_config: dict) -> DSparkDrafter:
    raw = read_config(path)
    head = str(raw.get("markov_head_type", "vanilla")).lower()
    if head not in HEADS:
        raise LoadError(f"{path}: DSpark markov_head_type {head!r} is not supported (one of {', '.join(HEADS)})")
    rule = raw.get("confidence_rule", "survival")
    if rule not in ("survival", "step"):
        raise LoadError(f"{path}: confidence_rule {rule!r} is not 'survival' or 'step'")
    nested = {k: raw[k] for k in ("mask_token_id", "target_layer_ids", "block_size") if k in raw}
    cfg = parse_config(DFlashConfig, {**raw, "dflash_config": {**nested, **(raw.get("dflash_config") or {})}}, path)
    cfg.extra["gemma"] = str(raw.get("model_type", "")).startswith("gemma")
    check_fit(cfg, target, target_config, path)
    weights = {}
    for f in check_safetensors(path):
        weights.update(mx.load(str(f)))
    model = DSparkDrafter(cfg, rank=raw.get("markov_rank", 256), confidence=raw.get("enable_confidence_head", False),
                          with_markov=raw.get("confidence_head_with_markov", True),
                          threshold=raw.get("confidence_threshold", 0.0), logits_start=raw.get("logits_start", 0),
                          head=head, rule=rule)
    weights = model.sanitize(weights)
    if cfg.quantization:
        q = cfg.quantization
        nn.quantize(model, group_size=q["group_size"], bits=q["bits"],
                    class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights)
    load_strict(model, weights, path)
    return model.bind(target)
