"""Model folders on disk: finding them (local or through the Hugging Face cache), reading their
config and safetensors headers, checking their weights, and loading an mlx-lm model from one.
The lowest layer of loading: `loading` and `drafters` both build on it."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .errors import LoadError

WEIGHT_GLOB = "model*.safetensors"
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]


def text_config(config: dict) -> dict:
    """The language model's settings: multimodal checkpoints (Qwen3.5, Gemma 3) nest them in `text_config`."""
    return {**config, **config.get("text_config", {})}


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


def safetensors_header(file: Path) -> tuple[dict, int]:
    """A safetensors file's header (tensor names, dtypes, shapes, offsets) and where its data starts,
    without reading the weights."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8:
            raise ValueError("header runs past the end")
        return json.loads(fh.read(n)), 8 + n


def weight_files(path: Path) -> list[Path]:
    return sorted(path.glob(WEIGHT_GLOB)) or sorted(path.glob("*.safetensors"))


def weight_names(path: Path) -> set[str]:
    """Tensor names of a model folder, from the safetensors headers."""
    return {k for f in weight_files(path) for k in safetensors_header(f)[0] if k != "__metadata__"}


def check_safetensors(path: Path) -> list[Path]:
    """Cheap integrity check of every weight file: header parses and data covers every tensor."""
    files = weight_files(path)
    if not files:
        raise LoadError(f"{path} has no .safetensors weights")
    for f in files:
        try:
            header, start = safetensors_header(f)
            end = start + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if end > f.stat().st_size:
                raise ValueError(f"{end - f.stat().st_size} bytes missing")
        except (ValueError, struct.error, KeyError, TypeError, UnicodeDecodeError) as e:
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
        # transformers 5 validates the model's config.json while looking for the tokenizer class and rejects
        # layer kinds it does not know (gear's "conv_mixer"); the tokenizer files name their own class
        from transformers import PretrainedConfig
        try:
            tokenizer = load_tokenizer(path, {"config": PretrainedConfig()}, eos_token_ids=config.get("eos_token_id"))
        except Exception:
            raise LoadError(f"cannot load the tokenizer from {path}: {_short(e)}") from None
    n_vocab = len(tokenizer._tokenizer)
    if n_vocab > config.get("vocab_size", n_vocab):
        raise LoadError(f"tokenizer in {path} has {n_vocab} tokens but the model's vocab_size is {config['vocab_size']}")
    return model, tokenizer, config


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
