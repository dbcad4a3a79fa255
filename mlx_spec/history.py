"""Opt-in local record of what the target committed, the data `mlx-spec adapt` learns from.

One folder per target under $XDG_DATA_HOME/mlx-spec/history/<target-key>/ (else
~/.local/share/...). Nothing leaves the machine; nothing is written unless an app is
started with --learn. A record is one finished generation: prompt token ids, output token
ids, and per-draft-position drafted/accepted counts (for `mlx-spec history`). No text, no
hidden states.

Crash safety: records are appended, one JSON line each, to `open.jsonl` and fsynced.
When that segment grows past `segment_bytes` it is fsynced and renamed (atomic) to
`seg-<n>.jsonl`, and a new open segment starts. So closed segments are always whole; a
crash can only tear the open segment's last line, which readers skip and the next writer
cuts off. The size cap drops whole closed segments, oldest first.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OPEN = "open.jsonl"
DEFAULT_CAP = 256 << 20  # 256 MiB per target: about 30M tokens of history


def data_dir() -> Path:
    """$XDG_DATA_HOME/mlx-spec, else ~/.local/share/mlx-spec."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mlx-spec"


def target_key(ref: str | None, path: Path | None = None) -> str:
    """A folder name per target: the embedded pair (both precisions) shares one; a hub id by its
    quantization-insensitive base name; a local folder by its name and a hash of its full path."""
    from . import models as registry
    from .loading import base_model_name
    from .model_files import resolve

    path = Path(path) if path is not None else resolve(str(ref) if ref else str(registry.DEFAULT_TARGET))
    if path.resolve() in (registry.DEFAULT_TARGET.resolve(), registry.DEFAULT_TARGET_8BIT.resolve()):
        return "mlx-spec-default"
    if ref and not Path(ref).expanduser().exists():  # a hub id
        return _safe(base_model_name(ref))
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    return f"{_safe(base_model_name(path.name))}-{digest}"


def _safe(name: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "model"


@dataclass
class Record:
    prompt: list[int]
    output: list[int]
    time: float = 0.0
    drafted: list[int] | None = None  # per draft position: rounds that drafted it
    accepted: list[int] | None = None  # per draft position: rounds that accepted it

    @property
    def tau(self) -> float | None:
        """1 + accepted drafts per drafting round (every drafting round drafts position 1)."""
        if not self.drafted or not self.drafted[0]:
            return None
        return 1 + sum(self.accepted or []) / self.drafted[0]

    def sequence(self) -> dict:
        """The trainer's input format, shared with train-drafter's data.jsonl."""
        return {"tokens": self.prompt + self.output, "prompt_len": len(self.prompt)}


class History:
    """The record store of one target. Safe across processes (an flock around each write)."""

    def __init__(self, folder: Path, cap_bytes: int = DEFAULT_CAP, segment_bytes: int | None = None):
        self.folder, self.cap = Path(folder), int(cap_bytes)
        # Segments small against the cap, so dropping the oldest one frees little at a time.
        self.segment_bytes = segment_bytes or max(4096, min(4 << 20, self.cap // 8))

    @classmethod
    def for_target(cls, key: str, cap_bytes: int = DEFAULT_CAP) -> "History":
        return cls(data_dir() / "history" / key, cap_bytes)

    # -- writing ---------------------------------------------------------------------------------

    def record(self, prompt, output, drafted=None, accepted=None, when: float | None = None) -> None:
        """Append one finished generation. Empty outputs teach nothing and are skipped."""
        if not output:
            return
        rec = {"time": round(when if when is not None else time.time(), 3), "prompt": [int(t) for t in prompt],
               "output": [int(t) for t in output], "drafted": list(drafted or []), "accepted": list(accepted or [])}
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        with self._locked():
            path = self.folder / OPEN
            _cut_torn_tail(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size >= self.segment_bytes:
                self._close_segment()
            self._enforce_cap()

    def record_generation(self, prompt, output, spec=None) -> None:
        """Record from a finished generation's ids and its `SpecStats` (None when it did not draft)."""
        self.record(prompt, output, spec.drafted_per_position if spec else None,
                    spec.accepted_per_position if spec else None)

    def _close_segment(self) -> None:
        n = max((_seg_no(p) for p in self._segments()), default=0) + 1
        os.replace(self.folder / OPEN, self.folder / f"seg-{n:08d}.jsonl")  # atomic: the segment is whole
        _fsync_dir(self.folder)

    def _enforce_cap(self) -> None:
        segments = self._segments()
        total = sum(p.stat().st_size for p in segments) + _size(self.folder / OPEN)
        for p in segments:  # oldest first
            if total <= self.cap:
                break
            total -= p.stat().st_size
            p.unlink()
        if total > self.cap and (self.folder / OPEN).exists():  # one open segment alone over the cap
            self._close_segment()
            self._segments()[-1].unlink()

    @contextmanager
    def _locked(self):
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.folder / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- reading ---------------------------------------------------------------------------------

    def records(self) -> list[Record]:
        """Every whole record, oldest first; a torn or unreadable line is skipped."""
        out = []
        for path in [*self._segments(), self.folder / OPEN]:
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # dropped by the cap or closed meanwhile
                continue
            for line in data.split(b"\n"):
                try:
                    r = json.loads(line)
                    out.append(Record(r["prompt"], r["output"], r.get("time", 0.0), r.get("drafted"), r.get("accepted")))
                except (ValueError, KeyError, TypeError):
                    continue
        return out

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._segments()) + _size(self.folder / OPEN)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def _segments(self) -> list[Path]:
        return sorted(self.folder.glob("seg-*.jsonl"), key=_seg_no) if self.folder.exists() else []


def _seg_no(path: Path) -> int:
    return int(path.stem.split("-")[1])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _cut_torn_tail(path: Path) -> None:
    """A crash mid-append leaves a last line without its newline: cut it, so appends stay line-aligned."""
    size = _size(path)
    if not size:
        return
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        fh.seek(0)
        keep = fh.read().rfind(b"\n") + 1
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def daily(records: list[Record]) -> list[tuple[str, int, int, float | None]]:
    """(day, requests, output tokens, τ over the day's drafting rounds), oldest day first."""
    days: dict[str, list] = {}
    for r in records:
        d = days.setdefault(time.strftime("%Y-%m-%d", time.localtime(r.time)), [0, 0, 0, 0])
        d[0] += 1
        d[1] += len(r.output)
        if r.drafted:
            d[2] += r.drafted[0]
            d[3] += sum(r.accepted or [])
    return [(day, n, toks, 1 + acc / rounds if rounds else None) for day, (n, toks, rounds, acc) in sorted(days.items())]


def add_learn_arguments(p) -> None:
    """--learn and --learn-cap, shared by `chat` and `serve`."""
    p.add_argument("--learn", action="store_true",
                   help="record each reply's prompt and output token ids locally, for `mlx-spec adapt` "
                        "(stored under $XDG_DATA_HOME/mlx-spec/history/; see `mlx-spec history`)")
    p.add_argument("--learn-cap", type=float, default=DEFAULT_CAP / (1 << 20), metavar="MB",
                   help="size cap of the recorded history per target; the oldest records go first")


def recorder_from(args, target_path: Path) -> History | None:
    """The store --learn writes to, or None without --learn."""
    if not getattr(args, "learn", False):
        return None
    return History.for_target(target_key(args.model, target_path), int(args.learn_cap * (1 << 20)))
