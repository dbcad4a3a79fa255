"""Drafters: DFlash and DSpark (block drafters), prompt lookup, a classic draft model; one interface."""

from __future__ import annotations

from pathlib import Path

from ..errors import DrafterMismatchError, MlxSpecError
from ..model_files import load_target, read_config, weight_names

MODES = ("auto", "dflash", "dflash2", "dspark", "eagle3", "mtp", "lookup", "draft-model", "off")


def checkpoint_kind(path: Path) -> str:
    from .dflash import detect_kind

    return detect_kind(read_config(path), weight_names(path))


def load_drafter(mode: str, path: Path | None, target, target_config: dict, block_size: int | None = None):
    """The drafter for `mode`; in "auto" mode a checkpoint's kind is read from its content."""
    if mode not in MODES:
        raise MlxSpecError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "off":
        return None
    if mode == "lookup" or (mode == "auto" and path is None):
        from .lookup import LookupDrafter

        return LookupDrafter(block_size or 8)
    if path is None:
        raise MlxSpecError(f"--mode {mode} needs a drafter (--drafter PATH or repo id)")
    drafter = _load_model_drafter(mode, path, target, target_config, block_size)
    if mode == "auto":  # and prompt lookup where this conversation favours it (drafters/pick.py)
        from .pick import PickDrafter

        return PickDrafter(drafter)
    return drafter


def model_drafter(drafter):
    """The drafter with a model behind it, where `drafter` may pick prompt lookup instead of it."""
    from .pick import PickDrafter

    return drafter.inner if isinstance(drafter, PickDrafter) else drafter


def learnt_blocks(drafter) -> list[int]:
    """The block sizes a drafter learnt, smallest first (a DFlash config's `block_sizes`); [] where it names none."""
    return sorted(getattr(getattr(drafter, "config", None), "block_sizes", None) or [])


def _load_model_drafter(mode: str, path: Path, target, target_config: dict, block_size: int | None):
    kind = "mtp" if mode == "mtp" else checkpoint_kind(path)  # a whole model with an MTP head reads as "lm"
    wanted = {"dflash": "dflash", "dflash2": "dflash2", "dspark": "dspark", "eagle3": "eagle3",
              "draft-model": "lm"}.get(mode, kind)
    if kind != wanted:
        what = {"lm": "a plain language model (a draft model)", "dflash": "a DFlash drafter", "dspark": "a DSpark drafter",
                "dflash2": "a DFlash 2 drafter", "eagle3": "an EAGLE-3 drafter",
                "mtp": "an MTP head (--mode mtp)"}.get(kind, "not a known drafter checkpoint")
        raise DrafterMismatchError(f"{path} is {what}, not what --mode {mode} expects")
    if kind in ("eagle3", "mtp"):
        from .eagle3 import load_eagle3
        from .mtp import load_mtp

        return (load_eagle3 if kind == "eagle3" else load_mtp)(path, target, target_config, block_size)
    if kind == "lm":
        return _draft_model(path, target_config, block_size)
    if kind == "dflash2":
        from .dflash2 import load_dflash2

        return load_dflash2(path, target, target_config)
    if kind == "dspark":
        from .dspark import load_dspark

        return load_dspark(path, target, target_config)
    from .dflash import load_dflash

    return load_dflash(path, target, target_config)  # refuses dspark / dflash2 / unknown with a clear message


def _draft_model(path: Path, target_config: dict, block_size: int | None):
    from .draft_model import DraftModelDrafter, check_vocab

    model, _, config = load_target(path)
    check_vocab(config, target_config, path)
    return DraftModelDrafter(model, block_size or 8)
