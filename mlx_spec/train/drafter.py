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
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from ..drafters.dflash import DFlashConfig, DFlashDrafter, save_dflash
from .checkpoint import load_checkpoint, save_checkpoint


@dataclass
class DrafterTrainConfig:
    out: Path = Path("runs/drafter")
    block_size: int = 8
    num_layers: int = 1
    target_layer_ids: list[int] | None = None
    steps: int = 2000
    sequences_per_step: int = 4
    anchors_per_sequence: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    decay_gamma: float = 4.0  # loss weight of slot k: exp(-(k-1)/gamma)
    checkpoint_every: int = 100
    eval_every: int = 250
    seed: int = 0


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
    )
    return DFlashDrafter(dcfg).bind(target)


def block_batch(tokens: list[int], prompt_len: int, n: int, block: int, mask: int, rng) -> tuple:
    """Random anchors in the answer: (anchor positions [n], block ids [n, B], labels [n, B-1] with -1 pads)."""
    lo, hi = max(prompt_len - 1, 0), len(tokens) - 1  # the anchor needs at least one token after it
    pos = np.sort(rng.integers(lo, hi, size=n)) if hi > lo else np.zeros(0, np.int64)
    toks = np.asarray(tokens + [-1] * block)
    ids = np.full((len(pos), block), mask, np.int32)
    ids[:, 0] = toks[pos]
    labels = np.stack([toks[p + 1 : p + block] for p in pos]) if len(pos) else np.zeros((0, block - 1), np.int64)
    return mx.array(pos.astype(np.int32)), mx.array(ids), mx.array(labels.astype(np.int32))


def sequence_loss(drafter: DFlashDrafter, hidden: mx.array, pos, ids, labels, gamma: float):
    """Weighted cross-entropy of one sequence's blocks; hidden [1, S, taps*H] from the frozen target."""
    target = drafter._target
    ctx = drafter.hidden_norm(drafter.fc(hidden))
    S = ctx.shape[1]
    visible = (mx.arange(S)[None, :] < pos[:, None])[:, None, None, :]  # context before each anchor
    h = target.embed(ids)
    for layer in drafter.layers:
        kv = layer.self_attn.context_kv(ctx, 0)
        h = layer(h, kv, pos, None, False, visible)
    logits = target.lm_head(drafter.norm(h[:, 1:])).astype(mx.float32)
    B1 = labels.shape[1]
    weight = mx.exp(-mx.arange(B1, dtype=mx.float32) / gamma)[None] * (labels >= 0)
    ce = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
    correct = (logits.argmax(-1) == labels) * (labels >= 0)
    return (ce * weight).sum(), weight.sum(), correct.sum(0), (labels >= 0).sum(0)


def train_drafter(target, config: dict, tokenizer, records: list[dict], cfg: DrafterTrainConfig,
                  evaluate=None) -> Path:
    """Train (or resume) and write the drafter in the public DFlash format to cfg.out / 'drafter'."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    cfg.out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(cfg.seed)
    drafter = new_drafter(target, config, tokenizer, cfg)
    target.set_taps(drafter.tap_ids)
    warm = optim.linear_schedule(cfg.lr * 0.01, cfg.lr, cfg.warmup)
    decay = optim.cosine_decay(cfg.lr, max(1, cfg.steps - cfg.warmup), cfg.lr * 0.05)
    optimizer = optim.AdamW(learning_rate=optim.join_schedules([warm, decay], [cfg.warmup]), weight_decay=cfg.weight_decay)
    ckpt = cfg.out / "checkpoint"
    start = load_checkpoint(ckpt, drafter, optimizer) if ckpt.exists() else 0
    records = [r for r in records if len(r["tokens"]) > r["prompt_len"] + 1]
    if not records:
        raise ValueError("no training sequences with an answer")
    mask = drafter.config.mask_token_id

    def loss_fn(model, batch):
        total, norm = mx.array(0.0), mx.array(0.0)
        hits, seen = mx.zeros(cfg.block_size - 1), mx.zeros(cfg.block_size - 1)
        for hidden, pos, ids, labels in batch:
            l, w, c, s = sequence_loss(model, hidden, pos, ids, labels, cfg.decay_gamma)
            total, norm, hits, seen = total + l, norm + w, hits + c, seen + s
        return total / mx.maximum(norm, 1.0), (hits, seen)

    grad_fn = nn.value_and_grad(drafter, loss_fn)
    log_file = (cfg.out / "log.jsonl").open("a")
    columns = [TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn()]
    with Progress(*columns) as bar:
        task = bar.add_task("drafter", total=cfg.steps, completed=start, info="")
        ema = None
        for step in range(start, cfg.steps):
            rng = np.random.default_rng([cfg.seed, step])
            batch = []
            for i in rng.integers(0, len(records), size=cfg.sequences_per_step):
                r = records[i]
                _, hidden = target(mx.array([r["tokens"]]), cache=None)
                batch.append((mx.stop_gradient(hidden),
                              *block_batch(r["tokens"], r["prompt_len"], cfg.anchors_per_sequence, cfg.block_size, mask, rng)))
            (loss, (hits, seen)), grads = grad_fn(drafter, batch)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            optimizer.update(drafter, grads)
            mx.eval(loss, hits, seen, drafter.parameters(), optimizer.state)
            loss = loss.item()
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            acc = (hits / mx.maximum(seen, 1)).tolist()
            record = {"step": step + 1, "loss": round(loss, 4), "slot_acc": [round(a, 3) for a in acc],
                      "lr": float(optimizer.learning_rate)}
            if evaluate and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
                record["tau"] = evaluate(drafter)
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                save_checkpoint(ckpt, drafter, optimizer, step + 1, cfg)
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            info = f"loss {ema:.3f} slot1 {acc[0]:.2f}" + (f" τ {record['tau']:.2f}" if "tau" in record else "")
            bar.update(task, completed=step + 1, info=info)
    return save_dflash(drafter, cfg.out / "drafter", {"mlx_spec": {"trained_with": "mlx-spec train-drafter",
                                                                   "steps": cfg.steps, "seed": cfg.seed}})
