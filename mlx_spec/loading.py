"""Resolve and load targets and drafters, with one clear error line for each way it can go wrong."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from . import cpu_layout
from . import models as registry_pkg
from .controller import ControllerMemory
from .drafters import load_drafter, model_drafter
from .drafters.mtp import has_mtp
from .errors import LoadError
from .model_files import load_target, resolve, text_config

@dataclass
class Loaded:
    """What `load` returns as `model`: the target, its drafter (or None) and where they came from."""

    target: "Target"  # the mlx-lm model with hidden-state taps; `.model` is the nn.Module
    drafter: object | None
    target_path: Path
    drafter_path: Path | None
    config: dict
    memory: ControllerMemory = field(default_factory=ControllerMemory)  # the controller's, across requests
    kv_cache: dict = field(default_factory=dict)  # PromptCache's kv_bits / kv_group_size (quantized KV), if set
    relaid: bool = False  # float32 weights laid out for the CPU's bundled BLAS (cpu_layout.py)

    @property
    def model(self) -> nn.Module:
        return self.target.model

    def __call__(self, *args, **kwargs):
        return self.target.model(*args, **kwargs)

    @property
    def context_length(self) -> int:
        return int(text_config(self.config).get("max_position_embeddings") or 0) or 1 << 20

    @property
    def vocab_size(self) -> int:
        return int(text_config(self.config).get("vocab_size") or 0)


def find_drafter(target_ref: str, target_path: Path) -> Path | None:
    """The drafter for a target: the embedded pair, else the registry (quantization-insensitive).
    A version `mlx-spec adapt` installed for this target comes first."""
    from .adapters import in_use

    adapted = in_use(target_ref, target_path)
    if adapted is not None:
        return adapted
    if target_path.resolve() in (registry_pkg.DEFAULT_TARGET.resolve(), registry_pkg.DEFAULT_TARGET_8BIT.resolve()):
        return registry_pkg.DEFAULT_DRAFTER if (registry_pkg.DEFAULT_DRAFTER / "config.json").exists() else None
    for pair in user_pairs():  # pairs `mlx-spec convert` wrote: this very folder, any drafter kind
        if Path(pair["target"]).resolve() == target_path.resolve() and Path(pair["drafter"]).exists():
            return Path(pair["drafter"])
    key = base_model_name(target_ref)
    for pair in registry_pkg.registry()["pairs"]:
        if base_model_name(pair["target"]) == key and pair["kind"] == "dflash":
            try:
                return resolve(pair["drafter"])
            except LoadError:
                return None
    return None


def user_registry() -> Path:
    """The user's own pairs: $XDG_DATA_HOME/mlx-spec/registry.json (else ~/.local/share/...)."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "mlx-spec" / "registry.json"


def user_pairs() -> list[dict]:
    try:
        return json.loads(user_registry().read_text())["pairs"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: no user pairs
        return []


def register_pair(target: Path, drafter: Path, kind: str) -> None:
    """Add (or replace) the pair for `target` in the user registry."""
    pairs = [p for p in user_pairs() if Path(p["target"]).resolve() != target.resolve()]
    pairs.append({"target": str(target.resolve()), "drafter": str(drafter.resolve()), "kind": kind})
    user_registry().parent.mkdir(parents=True, exist_ok=True)
    user_registry().write_text(json.dumps({"pairs": pairs}, indent=2) + "\n")


def base_model_name(ref: str) -> str:
    """'mlx-community/Qwen3-8B-4bit' and 'Qwen/Qwen3-8B' both give 'qwen3-8b'."""
    name = str(ref).rstrip("/").split("/")[-1].lower()
    return re.sub(r"(-(mlx|\d+bit|bf16|fp16|mxfp4|nvfp4|dwq|awq|gptq|q\d))+$", "", name)


def load(target: str | os.PathLike | None = None, drafter: str | os.PathLike | None = "auto", *,
         mode: str = "auto", dtype: str | None = None, quantize: int | None = None, kernels: bool = True,
         eval_every: int | None = None, block_size: int | None = None, kv_bits: int | None = None,
         kv_group_size: int = 64, relayout: bool | None = None):
    """Load a target and its drafter: `model, tokenizer = load(target, drafter=...)`.

    target: local folder or Hugging Face repo id; None means the embedded default model.
    drafter: folder or repo id; "auto" finds the known drafter for this target; None decodes plainly
        (unless `mode` asks for prompt lookup, which needs no model).
    mode: auto (the drafter's kind is read from its checkpoint; with no known drafter, the target's
        own MTP head if its checkpoint has one, else prompt lookup; a model drafter drafts with prompt
        lookup beside it, picked per conversation: drafters/pick.py), dflash, dspark, eagle3, mtp (the
        target's own MTP head, or --drafter a folder holding one), lookup, draft-model (any small LM
        sharing the tokenizer), off.
    kernels: use the custom Metal kernels where they win (on Metal only; elsewhere plain MLX runs).
    block_size: the widest block lookup, draft-model, EAGLE-3 and MTP drafters verify (a DFlash or
        DSpark drafter's is its checkpoint's); default 8 (MTP: 4).
    eval_every: start computing every n decoder layers while the host builds the rest of the pass;
        None: 2 on the CPU backend (where it was measured to pay), 0 (off) elsewhere.
    kv_bits, kv_group_size: hold full-attention layers' keys and values quantized (mlx-lm's
        QuantizedKVCache) in every prompt cache made for this model; None: full precision.
    relayout: lay float32 weights out row-major for `x @ W.T` (same values, faster products on the
        CPU's bundled BLAS); None: where that was measured to pay (cpu_layout.py).
    """
    from .cpu_swiglu import MLP_SWAPS
    from .kernels import CPU_SWAPS, KernelConfig, patch_model, patch_recurrence
    from .target import Target

    ref = str(target) if target is not None else str(registry_pkg.DEFAULT_TARGET)
    path = resolve(ref)
    model, tokenizer, config = load_target(path, dtype, quantize)
    config_k = KernelConfig(enabled=kernels)
    if config_k.active:
        patch_model(model, config_k)
    elif config_k.on_cpu:  # no kernels, but several rows' exps go in base 2 (cpu_attention.py, cpu_swiglu.py)
        patch_model(model, config_k, CPU_SWAPS)
    patch_recurrence(model)  # kernels on or off: on the CPU a verify block's Gated DeltaNet recurrence in one graph, same floats
    if eval_every is None:
        eval_every = 2 if mx.default_device() == mx.cpu else 0
    wrapped = Target(model, kernels=config_k, eval_every=eval_every)
    mode = "off" if drafter is None and mode == "auto" else mode  # lookup needs no drafter model
    drafter_path = None
    if mode not in ("off", "lookup"):
        drafter_path = find_drafter(ref, path) if drafter == "auto" else resolve(drafter)
        if drafter == "auto" and (mode == "mtp" or (mode == "auto" and drafter_path is None and has_mtp(path))):
            drafter_path, mode = path, "mtp"  # native MTP: the target's own checkpoint holds the drafter
    draft_model = load_drafter(mode, drafter_path, wrapped, config, block_size)
    if draft_model is not None:
        wrapped.check_speculation()  # caches that cannot roll back exactly: refused now, not mid-request
    if draft_model is not None and draft_model.tap_ids:
        wrapped.check_taps(tokenizer.encode("def main():\n    return 0\n")[:16] or [0, 1])
        wrapped.set_taps(draft_model.tap_ids)
    kv = check_kv_cache(model, kv_bits, kv_group_size)
    relaid = lay_out(model, draft_model, relayout)
    drafter_module = own_module(draft_model)
    if config_k.on_cpu and not config_k.active and drafter_module is not None:
        patch_model(drafter_module, config_k, MLP_SWAPS)  # a drafter's blocks: always several rows
    return Loaded(wrapped, draft_model, path, drafter_path, config, kv_cache=kv, relaid=relaid), tokenizer


def lay_out(model: nn.Module, drafter, relayout: bool | None = None) -> bool:
    """The target's and the drafter's float32 weights laid out for the CPU's bundled BLAS where asked
    (None: where it pays, cpu_layout.py); whether they were."""
    relaid = cpu_layout.pays() if relayout is None else relayout
    if relaid:
        own = own_module(drafter)
        cpu_layout.relayout(model, *([own] if own is not None else []))
    return relaid


def own_module(drafter) -> nn.Module | None:
    """The drafter's own weights as a module (a draft model's LM, a DFlash drafter), if it has any."""
    inner = model_drafter(drafter)
    return next((m for m in (inner, getattr(inner, "model", None)) if isinstance(m, nn.Module)), None)


KV_BITS, KV_GROUPS = (2, 3, 4, 5, 6, 8), (32, 64, 128)


def check_kv_cache(model: nn.Module, bits: int | None, group_size: int) -> dict:
    """PromptCache's quantized-KV settings, refused at load when the model cannot run with them (e.g.
    attention with sinks: mlx-lm's quantized attention has none)."""
    if bits is None:
        return {}
    if bits not in KV_BITS or group_size not in KV_GROUPS:
        raise LoadError(f"--kv-bits must be one of {KV_BITS} and --kv-group-size one of {KV_GROUPS}, "
                        f"got {bits} and {group_size}")
    from .engine.rollback import architecture, make_cache

    try:  # two tokens through fresh caches: any layer that cannot attend over quantized keys fails here
        mx.eval(model(mx.array([[0, 1]]), cache=make_cache(model, rollback=False, kv_bits=bits,
                                                            kv_group_size=group_size)))
    except Exception as e:
        raise LoadError(f"{architecture(model)} cannot use a quantized KV cache: {e}") from None
    return dict(kv_bits=bits, kv_group_size=group_size)
