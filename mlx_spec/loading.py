"""Resolve and load targets and drafters, with one clear error line for each way it can go wrong."""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from . import models as registry_pkg
from .controller import ControllerMemory
from .errors import LoadError

WEIGHT_GLOB = "model*.safetensors"
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]


@dataclass
class Loaded:
    """What `load` returns as `model`: the target, its drafter (or None) and where they came from."""

    target: "Target"  # the mlx-lm model with hidden-state taps; `.model` is the nn.Module
    drafter: object | None
    target_path: Path
    drafter_path: Path | None
    config: dict
    memory: ControllerMemory = field(default_factory=ControllerMemory)  # the controller's, across requests

    @property
    def model(self) -> nn.Module:
        return self.target.model

    def __call__(self, *args, **kwargs):
        return self.target.model(*args, **kwargs)

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings") or 0) or 1 << 20


def resolve(path_or_repo: str | os.PathLike) -> Path:
    """A local folder, or a Hugging Face repo id found through the HF cache (HF_HOME, HF_HUB_OFFLINE)."""
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"{path} is a file; expected a model folder with config.json")
        return path
    name = str(path_or_repo)
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", name):
        raise LoadError(f"no model folder at {name} (and it is not a Hugging Face repo id like org/name)")
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
        return Path(snapshot_download(name, allow_patterns=ALLOW_PATTERNS, local_files_only=offline))
    except Exception as e:  # huggingface_hub raises many kinds; all mean "not available"
        where = "in the local Hugging Face cache (offline)" if offline else "locally or on the Hub"
        raise LoadError(f"cannot find model {name} {where}: {type(e).__name__}") from None


def read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.exists():
        raise LoadError(f"{path} has no config.json; is it a model folder?")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise LoadError(f"{file} is not valid JSON: {e}") from None


def check_safetensors(path: Path) -> list[Path]:
    """Cheap integrity check of every weight file: header parses and data covers every tensor."""
    files = sorted(path.glob(WEIGHT_GLOB)) or sorted(path.glob("*.safetensors"))
    if not files:
        raise LoadError(f"{path} has no .safetensors weights")
    for f in files:
        size = f.stat().st_size
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > size - 8:
                    raise ValueError("header runs past the end")
                header = json.loads(fh.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end > size:
                raise ValueError(f"{8 + n + end - size} bytes missing")
        except (ValueError, struct.error, KeyError, UnicodeDecodeError) as e:
            raise LoadError(f"{f} is corrupt or truncated ({e})") from None
    return files


def load_target(path: Path, dtype: str | None = None, quantize: int | None = None):
    """Load an mlx-lm model and its tokenizer, following mlx-lm's conventions (no remote code)."""
    from mlx_lm.utils import _get_classes, load_model, load_tokenizer

    config = read_config(path)
    if "model_type" not in config:
        raise LoadError(f"{path}/config.json has no model_type")
    try:
        _get_classes(config)
    except ValueError:
        raise LoadError(f"unknown architecture {config['model_type']!r} in {path} (not supported by mlx-lm)") from None
    check_safetensors(path)
    try:
        model, config = load_model(path, trust_remote_code=False)
    except Exception as e:
        raise LoadError(f"cannot load weights from {path}: {_short(e)}") from None
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    if quantize:
        nn.quantize(model, group_size=64, bits=quantize)
    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise LoadError(f"cannot load the tokenizer from {path}: {_short(e)}") from None
    n_vocab = len(tokenizer._tokenizer)
    if n_vocab > config.get("vocab_size", n_vocab):
        raise LoadError(f"tokenizer in {path} has {n_vocab} tokens but the model's vocab_size is {config['vocab_size']}")
    return model, tokenizer, config


def find_drafter(target_ref: str, target_path: Path) -> Path | None:
    """The drafter for a target: the embedded pair, else the registry (quantization-insensitive)."""
    if target_path.resolve() in (registry_pkg.DEFAULT_TARGET.resolve(), registry_pkg.DEFAULT_TARGET_8BIT.resolve()):
        return registry_pkg.DEFAULT_DRAFTER if (registry_pkg.DEFAULT_DRAFTER / "config.json").exists() else None
    key = base_model_name(target_ref)
    for pair in registry_pkg.registry()["pairs"]:
        if base_model_name(pair["target"]) == key and pair["kind"] == "dflash":
            try:
                return resolve(pair["drafter"])
            except LoadError:
                return None
    return None


def base_model_name(ref: str) -> str:
    """'mlx-community/Qwen3-8B-4bit' and 'Qwen/Qwen3-8B' both give 'qwen3-8b'."""
    name = str(ref).rstrip("/").split("/")[-1].lower()
    return re.sub(r"(-(mlx|\d+bit|bf16|fp16|mxfp4|nvfp4|dwq|awq|gptq|q\d))+$", "", name)


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def load(target: str | os.PathLike | None = None, drafter: str | os.PathLike | None = "auto", *,
         mode: str = "auto", dtype: str | None = None, quantize: int | None = None, kernels: bool = True,
         eval_every: int | None = None):
    """Load a target and its drafter: `model, tokenizer = load(target, drafter=...)`.

    target: local folder or Hugging Face repo id; None means the embedded default model.
    drafter: folder or repo id; "auto" finds the known drafter for this target; None decodes plainly.
    mode: auto (the drafter's kind is read from its checkpoint; with no known drafter, prompt
        lookup), dflash, dspark, lookup, draft-model (any small LM sharing the tokenizer), off.
    kernels: use the custom Metal kernels where they win (on Metal only; elsewhere plain MLX runs).
    eval_every: start computing every n decoder layers while the host builds the rest of the pass;
        None: 2 on the CPU backend (where it was measured to pay), 0 (off) elsewhere.
    """
    from .drafters import load_drafter
    from .kernels import KernelConfig, patch_model
    from .target import Target

    ref = str(target) if target is not None else str(registry_pkg.DEFAULT_TARGET)
    path = resolve(ref)
    model, tokenizer, config = load_target(path, dtype, quantize)
    config_k = KernelConfig(enabled=kernels)
    if config_k.active:
        patch_model(model, config_k)
    if eval_every is None:
        eval_every = 2 if mx.default_device() == mx.cpu else 0
    wrapped = Target(model, kernels=config_k, eval_every=eval_every)
    mode = "off" if drafter is None else mode
    drafter_path = None
    if mode not in ("off", "lookup"):
        drafter_path = find_drafter(ref, path) if drafter == "auto" else resolve(drafter)
    draft_model = load_drafter(mode, drafter_path, wrapped, config)
    if draft_model is not None and draft_model.tap_ids:
        wrapped.check_taps(tokenizer.encode("def main():\n    return 0\n")[:16] or [0, 1])
        wrapped.set_taps(draft_model.tap_ids)
    return Loaded(wrapped, draft_model, path, drafter_path, config), tokenizer
