"""Resumable training state: weights, optimizer state and step, written atomically."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, is_dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MlxSpecError


def save_checkpoint(path: Path, model, optimizer, step: int, config=None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "weights.safetensors"), dict(tree_flatten(model.trainable_parameters())))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
    meta = {"step": step, "config": _jsonable(asdict(config) if is_dataclass(config) else config)}
    (tmp / "state.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def load_checkpoint(path: Path, model, optimizer, config=None) -> int:
    """Restore in place; returns the step to continue from. The checkpoint must hold this model's
    trainable weights, shape for shape, and have been started with the same `config.same_run` fields
    (what makes it the same run; the step count or learning rate may change on resume)."""
    same = getattr(config, "same_run", ())
    weights = mx.load(str(path / "weights.safetensors"))
    meta = json.loads((path / "state.json").read_text())
    ours = {k: v.shape for k, v in tree_flatten(model.trainable_parameters())}
    theirs = {k: v.shape for k, v in weights.items()}
    stored = meta.get("config") or {}  # (a setting it does not record cannot be compared)
    changed = [f"{f}: {stored[f]!r} there, {_field(config, f)!r} now" for f in same
               if f in stored and _field(config, f) != stored[f]]
    if ours != theirs and not changed:
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        changed = [f"other weights: {', '.join(differ[:3])}" + (", …" if len(differ) > 3 else "")]
    if changed:
        raise MlxSpecError(f"{path} is a checkpoint of another run ({'; '.join(changed)}): resume with the "
                           "settings it was started with, or train into a fresh --out")
    model.load_weights(list(weights.items()), strict=False)
    optimizer.state = tree_unflatten(list(mx.load(str(path / "optimizer.safetensors")).items()))
    return meta["step"]


def stopped(path: Path) -> str:
    """What a run stopped by --until says (the checkpoint's step: a rerun may already have been past it)."""
    if not (path / "state.json").exists():
        return f"stopped before the first step (the data is ready in {path.parent}); rerun without --until to train"
    step = json.loads((path / "state.json").read_text())["step"]
    return f"stopped at step {step}; checkpoint in {path}; rerun without --until to go on"


def _field(config, name: str):
    value = getattr(config, name)
    return _jsonable(asdict(value) if is_dataclass(value) else value)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj
