"""`mlx-spec train-drafter`: train a DFlash drafter for a target, with MLX.

Each step takes sequences the target wrote, runs the frozen target once for the tapped
hidden states, picks random anchor positions in the answer, and trains the drafter to
fill blocks [anchor, MASK...] with the target's next tokens. Blocks attend to the
context rows before their anchor and bidirectionally within themselves — the same
attention the drafter uses at inference. Later slots are weighted down (they are
reached less often).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from ..drafters.dflash import DFlashConfig, DFlashDrafter, save_dflash
from .checkpoint import load_checkpoint, save_checkpoint
from .config import DRAFTER_LABELS, DRAFTER_LOSSES, DrafterTrainConfig


def default_taps(n_layers: int, n_taps: int = 4) -> list[int]:
    """Spread over the target's depth, never the last layer (its output feeds the final norm)."""
    top = max(1, n_layers - 2)
    return sorted({round(1 + i * (top - 1) / max(1, n_taps - 1)) for i in range(n_taps)}) if n_layers > 2 else [0]


def mask_token_id(tokenizer, vocab_size: int) -> int:
    tid = tokenizer._tokenizer.convert_tokens_to_ids("<|MASK|>") if hasattr(tokenizer, "_tokenizer") else None
    if isinstance(tid, int) and tid >= 0 and tid != getattr(tokenizer, "unk_token_id", None):
        return tid
    if len(tokenizer._tokenizer) < vocab_size:  # padded vocabulary: an unused row
        return vocab_size - 1
    raise ValueError("the target has no <|MASK|> token and no spare vocabulary row; pass a mask token id")


def new_drafter(target, config: dict, tokenizer, cfg: DrafterTrainConfig) -> DFlashDrafter:
    tcfg = config.get("text_config", config)
    heads = tcfg["num_attention_heads"]
    dcfg = DFlashConfig(
        hidden_size=tcfg["hidden_size"], num_hidden_layers=cfg.num_layers, num_attention_heads=heads,
        num_key_value_heads=tcfg.get("num_key_value_heads", heads),
        head_dim=tcfg.get("head_dim") or tcfg["hidden_size"] // heads,
        intermediate_size=tcfg["intermediate_size"], vocab_size=tcfg["vocab_size"],
        mask_token_id=mask_token_id(tokenizer, tcfg["vocab_size"]),
        target_layer_ids=cfg.target_layer_ids or default_taps(target.num_layers),
        block_size=cfg.block_size, rms_norm_eps=tcfg.get("rms_norm_eps", 1e-6),
        rope_theta=tcfg.get("rope_theta") or 10000.0, max_position_embeddings=tcfg.get("max_position_embeddings", 4096),
        num_target_layers=target.num_layers,
        layer_types=["sliding_attention"] * cfg.num_layers if cfg.sliding_window else None,
        sliding_window=cfg.sliding_window, is_causal=False if cfg.sliding_window else None,
    )
    return DFlashDrafter(dcfg).bind(target)


def grow(drafter: DFlashDrafter, n_layers: int) -> DFlashDrafter:
    """A deeper copy of `drafter` that drafts exactly as it does: its layers, then new ones whose output
    projections start at zero, so each new layer adds nothing to the residual stream until training moves
    it (a fine-tune starts from the trained drafter's τ, not from a fresh layer's noise)."""
    cfg = drafter.config
    extra = n_layers - cfg.num_hidden_layers
    if extra < 0:
        raise ValueError(f"cannot grow a {cfg.num_hidden_layers}-layer drafter to {n_layers} layers: "
                         "a drafter can grow, not shrink")
    types = cfg.layer_types + cfg.layer_types[-1:] * extra if cfg.layer_types else None
    deeper = _rebuilt(drafter, replace(cfg, num_hidden_layers=n_layers, layer_types=types), "grow", strict=False)
    for layer in deeper.layers[cfg.num_hidden_layers:]:
        for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
            proj.update({k: mx.zeros_like(v) for k, v in proj.parameters().items()})
    mx.eval(deeper.parameters())
    return deeper


def reblock(drafter: DFlashDrafter, block_size: int) -> DFlashDrafter:
    """The same weights drafting blocks of another size (none of them depends on it). Untrained at the new
    size: the block's mask rows attend to each other, so even its first slots draft worse until fine-tuned."""
    if block_size < 2:
        raise ValueError(f"a drafting block holds the anchor and at least one draft, not {block_size}")
    return _rebuilt(drafter, replace(drafter.config, block_size=block_size, block_sizes=None), "re-block")


def _rebuilt(drafter: DFlashDrafter, config: DFlashConfig, change: str, strict: bool = True) -> DFlashDrafter:
    """A drafter of `config` holding `drafter`'s weights, bound to its target (strict=False: weights it adds
    keep their fresh initialization)."""
    if drafter.config.quantization:
        raise ValueError(f"cannot {change} a quantized drafter; train from its float weights")
    other = DFlashDrafter(config)
    other.load_weights(list(tree_flatten(drafter.parameters())), strict=strict)
    mx.eval(other.parameters())
    return other.bind(drafter._target) if drafter._target is not None else other


def block_batch(tokens: list[int], prompt_len: int, n: int, block: int, mask: int, rng) -> tuple:
    """Random anchors in the answer: (anchor positions [n], block ids [n, B], labels [n, B-1] with -1 pads)."""
    lo, hi = max(prompt_len - 1, 0), len(tokens) - 1  # the anchor needs at least one token after it
    pos = np.sort(rng.integers(lo, hi, size=n)) if hi > lo else np.zeros(0, np.int64)
    toks = np.asarray(tokens + [-1] * block)
    ids = np.full((len(pos), block), mask, np.int32)
    ids[:, 0] = toks[pos]
    labels = np.stack([toks[p + 1 : p + block] for p in pos]) if len(pos) else np.zeros((0, block - 1), np.int64)
    return mx.array(pos.astype(np.int32)), mx.array(ids), mx.array(labels.astype(np.int32))


def target_labels(tokens: list[int], greedy: np.ndarray, pos: mx.array, block: int) -> mx.array:
    """Labels [n, B-1] saying what the target itself drafts from each anchor: slot j is the target's argmax
    at row p+j-1 (greedy [S]: its argmax at every row of `tokens`), while the answer's tokens p+1..p+j-1
    agree with it (then that row's argmax is the target's greedy token j); slots after a disagreement, or
    past the answer's end, are -1. On a greedy answer these are the answer's own tokens; on a sampled one
    they keep verification's labels under contexts that greedy data never reaches."""
    toks, p = np.asarray(tokens + [-1] * block), np.asarray(pos)
    g = np.concatenate([greedy, np.full(block, -1)])
    agree = np.concatenate([toks[1:] == g[:-1], [False]])  # row k's argmax is the answer's token k + 1
    slots = p[:, None] + np.arange(block - 1)[None]  # rows p .. p+B-2 predict slots 1 .. B-1
    kept = np.cumprod(np.concatenate([np.ones((len(p), 1), bool), agree[slots[:, :-1]]], axis=1), axis=1)
    labels = np.where(kept.astype(bool) & (toks[slots + 1] >= 0), g[slots], -1)
    return mx.array(labels.astype(np.int32))


def block_sizes(n: int, sizes: list[int], rng) -> np.ndarray | None:
    """[n] the size each of n blocks is trained at, drawn evenly from `sizes`; None (every block whole, and
    the random stream untouched) where there is one size."""
    return rng.choice(sizes, size=n) if len(sizes) > 1 else None


def cut_labels(labels: mx.array, sizes: np.ndarray | None) -> mx.array:
    """Labels [n, B-1] with the slots past each block's own size padded (-1): a block of s rows drafts s - 1."""
    if sizes is None:
        return labels
    return mx.where(mx.arange(labels.shape[1])[None] < mx.array(sizes - 1)[:, None], labels, -1)


def train_logits(drafter: DFlashDrafter, hidden: mx.array, pos, ids, sizes: np.ndarray | None = None) -> mx.array:
    """[n, B-1, V] slot logits of n blocks at anchors `pos` over one sequence's tapped hidden states
    [1, S, taps*H]: each block sees the context rows inference would have cached by then, and, at `sizes`
    [n], only its first rows (what a block of that size holds; the later rows' logits are not trained)."""
    target, cfg = drafter._target, drafter.config
    ctx = drafter.hidden_norm(drafter.fc(hidden))
    rows = mx.arange(ctx.shape[1])[None, :]
    own = None if sizes is None else (mx.arange(ids.shape[1])[None] < mx.array(sizes)[:, None])[:, None, None, :]
    h = target.embed(ids)
    for i, layer in enumerate(drafter.layers):
        visible = rows < pos[:, None]  # context before each anchor
        window = cfg.window(i)
        if window is not None:  # what inference keeps: the last window - 1 rows
            visible = visible & (rows >= pos[:, None] - (window - 1))
        h = layer(h, layer.self_attn.context_kv(ctx, 0), pos, None, False, visible[:, None, None, :], own)
    return target.lm_head(drafter.norm(h[:, 1:])).astype(mx.float32)


def decay_gamma(cfg: DrafterTrainConfig, block_size: int) -> float:
    """The loss's decay over slots: the setting, else the DFlash paper's for the block (4 at 8, 5 at 10, 7 at
    16; held flat outside them), so a longer block's far slots still teach something."""
    return cfg.decay_gamma if cfg.decay_gamma is not None else float(np.interp(block_size, (8, 10, 16), (4, 5, 7)))


def sequence_loss(drafter: DFlashDrafter, hidden: mx.array, pos, ids, labels, gamma: float, loss: str = "ce",
                  teacher: mx.array | None = None, sizes: np.ndarray | None = None):
    """Weighted cross-entropy of one sequence's blocks; hidden [1, S, taps*H] from the frozen target.
    "kd" adds the KL divergence from the target's own next-token distribution at each slot (teacher: its
    logits [1, S, V] over the sequence), which says how close the runners-up were, not just which won.
    sizes: [n] each block's own size (`block_sizes`; None: whole blocks)."""
    if loss not in DRAFTER_LOSSES:
        raise ValueError(f"loss must be one of {', '.join(DRAFTER_LOSSES)}, not {loss!r}")
    logits = train_logits(drafter, hidden, pos, ids, sizes)
    labels = cut_labels(labels, sizes)
    B1 = labels.shape[1]
    valid = labels >= 0
    correct = (logits.argmax(-1) == labels) * valid
    weight = mx.exp(-mx.arange(B1, dtype=mx.float32) / gamma)[None] * valid
    if loss == "auf":
        weight = weight * auf_mask(correct)
    per_slot = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
    if loss == "kd":
        if teacher is None:
            raise ValueError("the kd loss needs the target's logits (teacher)")
        per_slot = per_slot + slot_kl(logits, teacher, pos, B1)
    return (per_slot * weight).sum(), weight.sum(), correct.sum(0), valid.sum(0)


def slot_kl(logits: mx.array, teacher: mx.array, pos: mx.array, n_slots: int) -> mx.array:
    """[n, B-1] KL(target || drafter) at each slot: slot j of the block at anchor p predicts token p+1+j,
    which the target's logits at row p+j predicted (rows past the sequence are clamped; their slots
    carry no weight)."""
    rows = mx.minimum(pos[:, None] + mx.arange(n_slots)[None], teacher.shape[1] - 1)
    target_logp = mx.stop_gradient(nn.log_softmax(teacher[0][rows].astype(mx.float32), axis=-1))
    return (mx.exp(target_logp) * (target_logp - nn.log_softmax(logits, axis=-1))).sum(-1)


def auf_mask(correct: mx.array) -> mx.array:
    """[n, B-1] 1 where every earlier slot of the block was right: slots up to and including the first miss."""
    ok = mx.cumprod(correct.astype(mx.float32), axis=1)
    return mx.stop_gradient(mx.concatenate([mx.ones_like(ok[:, :1]), ok[:, :-1]], axis=1))


class DrafterTrainer:
    """The training loop, one step at a time, so that a caller can interleave it with other work
    (the server's worker between requests) or stop on a time budget.

    Data: sequences {"tokens": ids, "prompt_len": n} — train-drafter's data.jsonl records and
    the local history store (`mlx_spec.history.Record.sequence`) both produce them; only the
    answer part (after prompt_len) is drafted. `init`: a drafter to start from (fine-tuning);
    else a new one from cfg.
    """

    def __init__(self, target, config: dict, tokenizer, records: list[dict], cfg: DrafterTrainConfig,
                 init: DFlashDrafter | None = None):
        if cfg.labels not in DRAFTER_LABELS:
            raise ValueError(f"labels must be one of {', '.join(DRAFTER_LABELS)}, not {cfg.labels!r}")
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.cfg, self.target = cfg, target
        if init is None:
            mx.random.seed(cfg.seed)  # only a new drafter's initialization draws from MLX's global RNG
        if init is not None and init.config.block_size != cfg.block_size:
            raise ValueError(f"the initial drafter drafts blocks of {init.config.block_size}, the settings ask for "
                             f"{cfg.block_size}: reblock() it first to fine-tune it to the new size")
        self.drafter = init if init is not None else new_drafter(target, config, tokenizer, cfg)
        self.block = self.drafter.config.block_size
        # what the drafter will say it drafts from: at run time a short draft runs the smallest that holds it
        self.drafter.config = replace(self.drafter.config, block_sizes=cfg.block_sizes)
        self.gamma = decay_gamma(cfg, self.block)
        target.set_taps(self.drafter.tap_ids)
        warm = optim.linear_schedule(cfg.lr * 0.01, cfg.lr, cfg.warmup)
        decay = optim.cosine_decay(cfg.lr, max(1, cfg.steps - cfg.warmup), cfg.lr * 0.05)
        self.optimizer = optim.AdamW(learning_rate=optim.join_schedules([warm, decay], [cfg.warmup]),
                                     weight_decay=cfg.weight_decay)
        self.checkpoint = cfg.out / "checkpoint"
        self.step_no = (load_checkpoint(self.checkpoint, self.drafter, self.optimizer, cfg)
                        if self.checkpoint.exists() else 0)
        self.records = [r for r in records if len(r["tokens"]) > r["prompt_len"] + 1]
        if not self.records:
            raise ValueError("no training sequences with an answer")
        self.grad_fn = nn.value_and_grad(self.drafter, self._loss)
        self.ema = None

    @property
    def done(self) -> bool:
        return self.step_no >= self.cfg.steps

    def _loss(self, model, batch):
        total, norm = mx.array(0.0), mx.array(0.0)
        hits, seen = mx.zeros(self.block - 1), mx.zeros(self.block - 1)
        for hidden, teacher, pos, ids, labels, sizes in batch:
            l, w, c, s = sequence_loss(model, hidden, pos, ids, labels, self.gamma, self.cfg.loss, teacher, sizes)
            total, norm, hits, seen = total + l, norm + w, hits + c, seen + s
        return total / mx.maximum(norm, 1.0), (hits, seen)

    def step(self, evaluate=None) -> dict:
        """One optimizer step (batch s depends only on seed and s, so a resumed run is the same run);
        checkpoints on schedule; returns the log record."""
        cfg, step = self.cfg, self.step_no
        rng = np.random.default_rng([cfg.seed, step])
        mask = self.drafter.config.mask_token_id
        batch = []
        for i in rng.integers(0, len(self.records), size=cfg.sequences_per_step):
            r = self.records[i]
            logits, hidden = self.target(mx.array([r["tokens"]]), cache=None)
            teacher = logits if cfg.loss == "kd" else None  # (unused logits are never computed)
            pos, ids, labels = block_batch(r["tokens"], r["prompt_len"], cfg.anchors_per_sequence, self.block, mask, rng)
            if cfg.labels == "target":
                labels = target_labels(r["tokens"], np.array(logits[0].argmax(-1)), pos, self.block)
            sizes = block_sizes(len(pos), cfg.block_sizes, rng)
            batch.append((mx.stop_gradient(hidden), teacher, pos, ids, labels, sizes))
        (loss, (hits, seen)), grads = self.grad_fn(self.drafter, batch)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        self.optimizer.update(self.drafter, grads)
        mx.eval(loss, hits, seen, self.drafter.parameters(), self.optimizer.state)
        self.step_no = step + 1
        loss = loss.item()
        self.ema = loss if self.ema is None else 0.95 * self.ema + 0.05 * loss
        acc = (hits / mx.maximum(seen, 1)).tolist()
        record = {"step": self.step_no, "loss": round(loss, 4), "slot_acc": [round(a, 3) for a in acc],
                  "lr": float(self.optimizer.learning_rate)}
        if evaluate and (self.step_no % cfg.eval_every == 0 or self.done):
            record["tau"] = evaluate(self.drafter)
        if self.step_no % cfg.checkpoint_every == 0 or self.done:
            self.save_checkpoint()
        with (cfg.out / "log.jsonl").open("a") as log_file:
            log_file.write(json.dumps(record) + "\n")
        return record

    def save_checkpoint(self) -> None:
        save_checkpoint(self.checkpoint, self.drafter, self.optimizer, self.step_no, self.cfg)

    def info(self, record: dict) -> str:
        return f"loss {self.ema:.3f} slot1 {record['slot_acc'][0]:.2f}" + (f" τ {record['tau']:.2f}" if "tau" in record else "")


def train_drafter(target, config: dict, tokenizer, records: list[dict], cfg: DrafterTrainConfig,
                  evaluate=None, init: DFlashDrafter | None = None, until: int | None = None,
                  provenance: dict | None = None) -> Path | None:
    """Train (or resume) and write the drafter in the public DFlash format to cfg.out / 'drafter'.
    `until`: stop after that step with a checkpoint and write nothing (None returned); a rerun goes on.
    `provenance`: recorded in its config beside the steps and seed (what it was fine-tuned from, on what)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    trainer = DrafterTrainer(target, config, tokenizer, records, cfg, init=init)
    columns = [TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn()]
    with Progress(*columns) as bar:
        task = bar.add_task("drafter", total=cfg.steps, completed=trainer.step_no, info="")
        while not trainer.done and (until is None or trainer.step_no < until):
            record = trainer.step(evaluate)
            bar.update(task, completed=trainer.step_no, info=trainer.info(record))
    if not trainer.done:
        if trainer.step_no:  # (--until 0 prepares the data only: nothing to resume, no settings pinned)
            trainer.save_checkpoint()
        return None
    meta = {"trained_with": "mlx-spec train-drafter", "steps": cfg.steps, "seed": cfg.seed, "lr": cfg.lr,
            **(provenance or {})}
    return save_dflash(trainer.drafter, cfg.out / "drafter", {"mlx_spec": meta})
