"""Installed versions of a target's locally adapted drafter, and which one is in use.

$XDG_DATA_HOME/mlx-spec/adapters/<target-key>/ holds v1, v2, ... (DFlash drafter folders,
never modified once written), `manifest.json` ({"current": n, "versions": [...]}; current 0
means the shipped or registry drafter) and `work/` (an adaptation in progress: its
checkpoint and data split, so it resumes). No MLX here: `find_drafter` reads this on every load.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .errors import MlxSpecError
from .history import data_dir


def folder(key: str) -> Path:
    return data_dir() / "adapters" / key


def work_dir(key: str) -> Path:
    return folder(key) / "work"


def manifest(key: str) -> dict:
    try:
        return json.loads((folder(key) / "manifest.json").read_text())
    except (FileNotFoundError, ValueError):
        return {"current": 0, "versions": []}


def current(key: str) -> Path | None:
    """The drafter folder in use for this target, or None for the shipped/registry one."""
    n = manifest(key).get("current", 0)
    path = folder(key) / f"v{n}"
    return path if n and (path / "config.json").exists() else None


def install(key: str, drafter_dir: Path, report: dict) -> Path:
    """Move an accepted drafter in as the next version and make it current."""
    m = manifest(key)
    n = max((v["version"] for v in m["versions"]), default=0) + 1
    dest = folder(key) / f"v{n}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(drafter_dir), str(dest))
    m["versions"].append({"version": n, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "previous": m["current"],
                          **report})
    m["current"] = n
    _write(key, m)
    return dest


def rollback(key: str) -> int:
    """Make the version before the current one current again (0: the shipped drafter); returns it.
    The rolled-back version's files stay on disk, untouched, and are listed in the manifest."""
    m = manifest(key)
    if not m["current"]:
        raise MlxSpecError("no adapted drafter is in use for this target; nothing to roll back")
    entry = next(v for v in m["versions"] if v["version"] == m["current"])
    entry["rolled_back"] = True
    m["current"] = entry.get("previous", 0)
    _write(key, m)
    return m["current"]


def _write(key: str, m: dict) -> None:
    path = folder(key) / "manifest.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(m, indent=2) + "\n")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # a crash leaves the old manifest or the new one, never half of one


def in_use(target_ref: str, target_path: Path) -> Path | None:
    """For `find_drafter`: the adapted drafter in use for this target, if any."""
    from .history import target_key

    return current(target_key(target_ref, target_path))
