"""Resumable training state: weights, optimizer state and step, written atomically."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, is_dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten


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


def load_checkpoint(path: Path, model, optimizer) -> int:
    """Restore in place; returns the step to continue from."""
    model.load_weights(str(path / "weights.safetensors"), strict=False)
    optimizer.state = tree_unflatten(list(mx.load(str(path / "optimizer.safetensors")).items()))
    return json.loads((path / "state.json").read_text())["step"]


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj
