"""`mlx-spec train-target`: the recipe that produces the embedded target model.

A small Qwen3-architecture model (mlx-lm's own `qwen3` module, not a copy) trained
from scratch on the offline corpus. Deterministic given the seed: the batch at
step s depends only on (seed, s), so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3

from ..errors import MlxSpecError
from . import corpus
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TargetTrainConfig
from .tokenizer import ENDOFTEXT, IM_END, render_chat, save_tokenizer, train_tokenizer
from .unlikelihood import Rollouts, unlikelihood_loss


# ----------------------------------------------------------------------------- data


def prepare_data(cfg: TargetTrainConfig, log=print) -> tuple[np.ndarray, np.ndarray]:
    """Build (once) the tokenizer and the tokenized train/val streams under cfg.out/data."""
    data = cfg.out / "data"
    if (data / "train.npy").exists():
        return np.load(data / "train.npy"), np.load(data / "val.npy")
    if cfg.split not in ("order", "source"):
        raise ValueError(f"split must be 'order' or 'source', not {cfg.split!r}")
    log("building corpus …")
    keyed = corpus.keyed_documents(cfg.corpus, render_chat)
    docs = [(kind, text) for _, kind, text in keyed]
    log(f"corpus: {corpus.describe(docs)}")
    if cfg.tokenizer_from is not None:
        tok = copy_tokenizer(Path(cfg.tokenizer_from), data / "tokenizer")
    else:
        tok = train_tokenizer((text for _, text in docs), cfg.vocab_size)
        save_tokenizer(tok, data / "tokenizer", cfg.max_position_embeddings)
    eot = tok.token_to_id(ENDOFTEXT)
    encoded = tok.encode_batch([text for _, text in docs])
    if cfg.split == "order":
        n_val = max(1, int(len(docs) * cfg.val_fraction))
        parts = (encoded[n_val:], encoded[:n_val])
    else:
        val = [corpus.held_out(key, cfg.val_fraction) for key, _, _ in keyed]
        parts = ([e for e, v in zip(encoded, val) if not v], [e for e, v in zip(encoded, val) if v])
    streams = []
    for part in parts:
        ids = [i for enc in part for i in enc.ids + [eot]]
        streams.append(np.asarray(ids, dtype=np.uint16))
    np.save(data / "train.npy", streams[0])
    np.save(data / "val.npy", streams[1])
    (data / "corpus.json").write_text(corpus.describe(docs) + "\n")
    log(f"tokens: train {len(streams[0]):,}, val {len(streams[1]):,}")
    return streams[0], streams[1]


def copy_tokenizer(src: Path, dst: Path):
    import shutil

    from tokenizers import Tokenizer

    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if not (src / name).exists():
            raise FileNotFoundError(f"--tokenizer-from {src}: no {name}")
        shutil.copy(src / name, dst / name)
    return Tokenizer.from_file(str(dst / "tokenizer.json"))


def batch_at(stream: np.ndarray, seed: int, step: int, batch: int, seq_len: int) -> mx.array:
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(stream) - seq_len - 1, size=batch)
    return mx.array(np.stack([stream[s : s + seq_len + 1] for s in starts]).astype(np.int32))


# ----------------------------------------------------------------------------- training


def loss_fn(model: nn.Module, tokens: mx.array) -> tuple[mx.array, mx.array]:
    logits = model(tokens[:, :-1])
    targets = tokens[:, 1:]
    loss = nn.losses.cross_entropy(logits, targets, reduction="mean")
    accuracy = (logits.argmax(-1) == targets).astype(mx.float32).mean()
    return loss, accuracy


def schedule(cfg: TargetTrainConfig):
    warm = optim.linear_schedule(cfg.lr * 0.01, cfg.lr, cfg.warmup)
    decay = optim.cosine_decay(cfg.lr, max(1, cfg.steps - cfg.warmup), cfg.lr * cfg.min_lr_ratio)
    return optim.join_schedules([warm, decay], [cfg.warmup])


def evaluate(model: nn.Module, val: np.ndarray, cfg: TargetTrainConfig) -> tuple[float, float]:
    return validation(model, val, cfg.seq_len, cfg.eval_batches, cfg.batch_size, cfg.seed + 1)


def validation(model: nn.Module, val: np.ndarray, seq_len: int, batches: int = 16, batch_size: int = 8,
               seed: int = 1) -> tuple[float, float]:
    """Mean loss and top-1 accuracy over fixed windows of the held-out stream (the same windows for
    every model, so numbers compare before/after)."""
    seq_len = min(seq_len, len(val) - 2)
    stats = [loss_fn(model, batch_at(val, seed, i, batch_size, seq_len)) for i in range(batches)]
    return sum(s[0].item() for s in stats) / len(stats), sum(s[1].item() for s in stats) / len(stats)


def train(cfg: TargetTrainConfig, init_from: Path | None = None, until: int | None = None) -> Path | None:
    """Train (or resume) and export the model; returns the exported folder. `until`: stop after that
    step with a checkpoint and export nothing (None returned) — a time-boxed slice of a long run."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    init = init_weights(init_from) if init_from is not None else None  # (before the corpus: minutes)
    cfg.out.mkdir(parents=True, exist_ok=True)
    train_ids, val_ids = prepare_data(cfg)
    tok_dir = cfg.out / "data" / "tokenizer"
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"]
    mx.random.seed(cfg.seed)
    model = qwen3.Model(cfg.model_args(len(vocab)))
    optimizer = optim.AdamW(learning_rate=schedule(cfg), weight_decay=cfg.weight_decay)
    ckpt = cfg.out / "checkpoint"
    start = 0
    if ckpt.exists():
        start = load_checkpoint(ckpt, model, optimizer, cfg)
    elif init is not None:
        model.load_weights(str(init))
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))

    state = [model.state, optimizer.state]
    rollouts = _rollouts(cfg, tok_dir)
    ul_weight = cfg.unlikelihood.weight if rollouts is not None else 0.0

    def _step(tokens, *rollout):
        def objective(model):
            loss, acc = loss_fn(model, tokens)
            ul = unlikelihood_loss(model, *rollout) if rollout else mx.zeros(())
            return loss + ul_weight * ul, loss, acc, ul

        (_, loss, acc, ul), grads = nn.value_and_grad(model, objective)(model)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss, acc, ul

    # (the rollouts' shapes change every step: compiling would trace each one anew)
    step_fn = mx.compile(_step, inputs=state, outputs=state) if rollouts is None else _step
    log_file = (cfg.out / "log.jsonl").open("a")
    tokens_per_step = cfg.batch_size * cfg.seq_len
    columns = [TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[info]}"), TimeRemainingColumn()]
    with Progress(*columns) as bar:
        task = bar.add_task("train", total=cfg.steps, completed=start, info=f"{n_params/1e6:.1f}M params")
        t0, ema = time.perf_counter(), None
        for step in range(start, min(cfg.steps, until) if until is not None else cfg.steps):
            rollout, repeats = (), None
            if rollouts is not None:
                *rollout, repeats = rollouts.batch(model, step)
            loss, acc, ul = step_fn(batch_at(train_ids, cfg.seed, step, cfg.batch_size, cfg.seq_len), *rollout)
            mx.eval(loss, acc, ul, state)
            loss = loss.item()
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            dt, t0 = time.perf_counter() - t0, time.perf_counter()
            record = {"step": step + 1, "loss": round(loss, 4), "acc": round(acc.item(), 4),
                      "lr": float(optimizer.learning_rate), "tok_s": round(tokens_per_step / dt)}
            if repeats is not None:  # the share of the model's own answer tokens in a repeated 4-gram
                record["ul"], record["repeats"] = round(ul.item(), 4), round(repeats, 4)
            if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
                record["val_loss"], record["val_acc"] = (round(x, 4) for x in evaluate(model, val_ids, cfg))
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 in (cfg.steps, until):
                save_checkpoint(ckpt, model, optimizer, step + 1, cfg)
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
            info = f"loss {ema:.3f}" + (f" val {record['val_loss']:.3f}" if "val_loss" in record else "")
            info += f" repeats {repeats:.2f}" if repeats is not None else ""
            bar.update(task, completed=step + 1, info=f"{info} {record['tok_s']} tok/s")
    if until is not None and until < cfg.steps:
        return None
    return export(model, cfg, tok_dir, cfg.out / "model")


def init_weights(path: Path) -> Path:
    """The weights `--init-from` names: an exported model's, or a run's checkpoint's (one stage of a
    recipe continued from another's step without exporting it)."""
    for name in ("model.safetensors", "weights.safetensors"):
        if (path / name).is_file():
            return path / name
    raise MlxSpecError(f"--init-from {path}: neither an exported model (model.safetensors) nor a run's "
                       "checkpoint (weights.safetensors)")


def _rollouts(cfg: TargetTrainConfig, tok_dir: Path) -> Rollouts | None:
    if cfg.unlikelihood is None:
        return None
    from mlx_lm.utils import load_tokenizer

    return Rollouts(cfg.unlikelihood, load_tokenizer(tok_dir), cfg.seed)


def export(model, cfg: TargetTrainConfig, tok_dir: Path, out: Path) -> Path:
    """Write the model in the Hugging Face / mlx-lm layout."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    args = model.args
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos = [ids[IM_END], ids[ENDOFTEXT]]
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": args.hidden_size, "num_hidden_layers": args.num_hidden_layers,
        "intermediate_size": args.intermediate_size, "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads, "head_dim": args.head_dim,
        "rms_norm_eps": args.rms_norm_eps, "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_position_embeddings, "rope_theta": args.rope_theta,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "torch_dtype": "float32", "bos_token_id": ids[ENDOFTEXT], "eos_token_id": eos,
        "mlx_spec": {"trained_with": "mlx-spec train-target", "seq_len": cfg.seq_len, "seed": cfg.seed},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": ids[ENDOFTEXT], "eos_token_id": eos, "do_sample": True,
                  "temperature": 0.7, "top_p": 0.9, "top_k": 40}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tok_dir / name, out / name)
    return out


def quantize_copy(src: Path, dst: Path, bits: int = 8, group_size: int = 64) -> Path:
    """An affine-quantized copy (float32 scales: the fast path on CPU) in mlx-lm's layout."""
    from mlx_lm.utils import load_model, quantize_model, save_config

    model, config = load_model(src)
    model, config = quantize_model(model, config, group_size=group_size, bits=bits)
    dst.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dst / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"})
    save_config(config, config_path=dst / "config.json")
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    return dst
