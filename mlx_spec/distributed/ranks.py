"""Starting the other ranks from the user's own process (`chat --distributed`): the terminal process is
rank 0 and starts its followers, as `mlx.launch`'s ring backend would (MLX_RANK, MLX_HOSTFILE), so
that the chat keeps its terminal (mlx.launch gives every rank a pipe, not a terminal).

- `-n N`: N-1 local followers on free loopback ports;
- `--hostfile FILE`: mlx.launch's host list (`[{"ssh": "host", "ips": ["10.0.0.2"]}, ...]`, rank 0
  first, this machine): followers on the other hosts start over ssh (their hostfile written there).

Followers get their own session (a Ctrl-C in the terminal is rank 0's to handle, not theirs) and, on
Linux, die with rank 0 (PR_SET_PDEATHSIG); their stderr goes to a log file named in rank 0's errors.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .session import DistributedError

LOCAL = ("127.0.0.1", "localhost", "::1")
FIRST_PORT = 32323  # mlx.launch's default starting port


def _die_with_parent() -> None:  # runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the ring's closed sockets still end the followers


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def ring_hosts(n: int | None, hostfile: Path | None) -> tuple[list[list[str]], list[str]]:
    """(the ring backend's hostfile rows, the ssh host of each rank)."""
    if hostfile is None:
        if n is None or n < 2:
            raise DistributedError("chat --distributed starts its own ranks: give -n N (N >= 2 local ranks) or "
                                   "--hostfile FILE (mlx.launch's host list), or start it under mlx.launch")
        return [[f"127.0.0.1:{p}"] for p in free_ports(n)], ["127.0.0.1"] * n
    try:
        hosts = json.loads(Path(hostfile).read_text())
        rows = [[f"{ip}:{FIRST_PORT + r}" for ip in h["ips"]] for r, h in enumerate(hosts)]
        ssh = [h.get("ssh", h["ips"][0]) for h in hosts]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise DistributedError(f"--hostfile {hostfile}: want mlx.launch's host list, [{{\"ssh\": host, \"ips\": "
                               f"[ip, ...]}}, ...] with this machine first: {e}") from None
    if len(hosts) < 2 or not all(rows):
        raise DistributedError(f"--hostfile {hostfile}: at least two hosts, each with an ip")
    return rows, ssh


class Followers:
    """The ranks 1..N-1 this process started; `close` ends whichever are still running."""

    def __init__(self, rows: list[list[str]], ssh: list[str], argv: list[str]):
        self.logs: list[Path] = []
        self.procs: list[subprocess.Popen] = []
        folder = Path(tempfile.mkdtemp(prefix="mlx-spec-ranks-"))
        hostfile = folder / "hosts.json"
        hostfile.write_text(json.dumps(rows))
        os.environ.update(MLX_RANK="0", MLX_HOSTFILE=str(hostfile))  # this process: rank 0 (read at init)
        cmd = [sys.executable, "-m", "mlx_spec.cli", "chat", *argv]
        for rank in range(1, len(rows)):
            log = folder / f"rank{rank}.log"
            self.logs.append(log)
            env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
            if ssh[rank] in LOCAL:
                args, popen_env = cmd, {**os.environ, **env}
            else:  # as mlx.launch does: the hostfile travels inside the remote command
                script = (f"cd {shlex.quote(os.getcwd())} 2>/dev/null; f=$(mktemp); printf %s "
                          f"{shlex.quote(json.dumps(rows))} > $f; MLX_RANK={rank} MLX_HOSTFILE=$f exec "
                          f"{shlex.join(cmd)}")
                args, popen_env = ["ssh", ssh[rank], script], None
            with open(log, "wb") as err:
                self.procs.append(subprocess.Popen(args, env=popen_env, stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                                   preexec_fn=_die_with_parent))

    def dead(self, wait: float = 1.0) -> str:
        """Which followers have exited, with their logs' last line ('' if all run). Asked after a lost
        connection: a follower's sockets close while it dies, a moment before its exit can be read."""
        deadline = time.monotonic() + wait
        while all(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = []
        for rank, (p, log) in enumerate(zip(self.procs, self.logs), start=1):
            if p.poll() is not None:
                lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
                out.append(f"rank {rank} exited ({p.returncode}{': ' + lines[-1][:200] if lines else ''}; log {log})")
        return "; ".join(out)

    def close(self, wait: float = 5.0) -> None:
        deadline = time.monotonic() + wait
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def follower_argv(args) -> list[str]:
    """The model options a follower needs (sampling and display travel with each reply)."""
    out = ["--distributed", "--rank-timeout", str(args.rank_timeout)]
    for flag, value in (("--model", args.model), ("--drafter", args.drafter), ("--mode", args.mode),
                        ("--block-size", args.block_size), ("--dtype", args.dtype), ("--split", args.split)):
        if value is not None:
            out += [flag, str(value)]
    return out + (["--no-draft"] if args.no_draft else [])
