"""`mlx-spec chat --distributed` in a real terminal (tmux): the terminal process is rank 0 and starts
its followers (-n N; --hostfile over ssh); replies equal one process's, across turns, /regen and a
reply stopped with Ctrl-C; a killed follower gives a clear message in the chat, not a hang; leaving
ends every rank."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from test_chat_terminal import STATS, Terminal, last_stats

pytestmark = pytest.mark.skipif(not Path("/proc").exists(), reason="finds the ranks through /proc")

ARGS = ["--distributed", "--max-tokens", "24", "--baseline-tokens", "0", "--no-history"]


def ranks_of(tmp_path) -> dict[int, int]:
    """rank -> pid of the chat's processes (found by the state folder only this test's chat has)."""
    mark = f"XDG_STATE_HOME={tmp_path / 'state'}".encode()
    out = {}
    for d in Path("/proc").iterdir():
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if mark in env and b"mlx_spec.cli" in (d / "cmdline").read_bytes():
            # rank 0 is the terminal's own process: it sets MLX_RANK for itself after it started
            out[next((int(e[9:]) for e in env if e.startswith(b"MLX_RANK=")), 0)] = int(d.name)
    return out


def wait_gone(tmp_path, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while ranks_of(tmp_path):
        assert time.monotonic() < deadline, f"ranks still running after the chat left: {ranks_of(tmp_path)}"
        time.sleep(0.1)


def one_process(conversation: list[dict], max_tokens: dict[int, int]) -> list[str]:
    """What one process's chat replies to each user turn of `conversation` (greedy, block 8), the n-th
    reply with max_tokens[n] tokens at most."""
    from mlx_spec import load
    from mlx_spec.app.chat.session import Session
    from mlx_spec.app.chat.settings import Settings
    from mlx_spec.app.chat.worker import TICK

    model, tokenizer = load(None)
    session = Session(model, tokenizer)
    turns = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    return ["".join(r.text for r in session.reply(conversation[:i], Settings(max_tokens=max_tokens[n], block_size=8))
                    if r is not TICK) for n, i in enumerate(turns)]


@pytest.fixture
def terminal(tmp_path):
    opened = []

    def start(*args):
        opened.append(Terminal(tmp_path, list(args)))
        return opened[-1]

    yield start
    for t in opened:
        t.close()
    for pid in ranks_of(tmp_path).values():  # a failed test leaves nothing running either
        os.kill(pid, signal.SIGKILL)


def test_chat_across_ranks_as_one_process_then_a_killed_follower_is_a_clear_message(terminal, tmp_path):
    """Two ranks (three stages, a middle one too, run in test_distributed): turns, /regen, a reply stopped
    with Ctrl-C and a turn after it equal one process's chat; then the follower is killed: the next reply
    fails at once with a clear message, the chat stays up, and leaving leaves no rank running. (Leaving
    with every follower alive: the --hostfile test.)"""
    t = terminal(*ARGS, "-n", "2", "--rank-timeout", "10")
    t.wait("block size 8, 2 ranks", timeout=120, what="the banner")
    assert sorted(ranks_of(tmp_path)) == [0, 1]
    first = t.send("hello")
    second = t.send("tell me more")
    # every rank reused its cache: the whole first turn (its prompt at least) comes from it
    assert int(re.search(r"\((\d+) cached\)", second).group(1)) >= int(re.search(r"prompt (\d+)", first).group(1))
    t.send("/regen")
    t.send("/set max_tokens 400")
    long = "Write a Python function `add(a, b)` that returns the sum of a and b."  # the reply runs to 400 tokens
    t.type(long)  # (a short one can end before the Ctrl-C on a quiet machine)
    t.wait(lambda s: s.rstrip().partition(f">>> {long}\n")[2].strip(), what="the reply to start")
    t.keys("C-c")  # stops every rank after the same round
    t.ready(timeout=20)
    assert last_stats(t.screen()).endswith("· stopped")
    t.send("/set max_tokens 24")
    t.send("and then?")  # the ranks' caches are still in step after the stop
    saved = tmp_path / "c.json"
    t.send(f"/save {saved}")

    os.kill(ranks_of(tmp_path)[1], signal.SIGKILL)
    t0 = time.monotonic()
    out = t.send("one more")
    assert time.monotonic() - t0 < 15
    assert "the distributed target failed" in out and "rank 1 exited" in out, out
    assert "the distributed target failed" in t.send("again?")  # at once, and the chat stays up
    t.keys("C-d")
    assert t.exit_status(timeout=20) == 0
    wait_gone(tmp_path)
    assert "Traceback" not in t.screen()

    conversation = json.loads(saved.read_text())["messages"]
    got = [m["content"] for m in conversation if m["role"] == "assistant"]
    want = one_process(conversation, {0: 24, 1: 24, 2: 400, 3: 24})  # the stopped reply could run to 400
    assert len(got) == 4 and got[1] == want[1]  # /regen replaced the second reply with the same one
    assert got[0] == want[0] and got[3] == want[3]
    assert got[2] and want[2].startswith(got[2]) and len(got[2]) < len(want[2])  # stopped part-way


@pytest.mark.slow  # a second chat launch; the -n path above runs the same ranks
def test_hostfile_starts_the_followers_over_ssh_and_leaving_ends_them(terminal, tmp_path, monkeypatch):
    """--hostfile (mlx.launch's host list): rank 1's host is not this one, so it starts over ssh, its hostfile
    written on the other side (here `ssh` is a stand-in on PATH that runs the command locally); /bye with the
    follower alive tells it to exit: no rank is left."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\necho "$1" >> "$(dirname "$0")/hosts"\nexec bash -c "$2"\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "localhost", "ips": ["127.0.0.1"]}, {"ssh": "node1", "ips": ["127.0.0.1"]}]))
    t = terminal(*ARGS, "--hostfile", str(hosts))
    t.wait("2 ranks", timeout=120, what="the banner")
    assert (bin_dir / "hosts").read_text().split() == ["node1"]
    assert len(STATS.findall(t.send("hello"))) == 1
    t.type("/bye")
    assert t.exit_status(timeout=20) == 0
    wait_gone(tmp_path)


@pytest.mark.slow
def test_chat_joins_under_mlx_launch(tmp_path):
    """Started by `mlx.launch` (MLX_RANK set: it joins, starts nothing): rank 0 reads its stdin as lines, the
    reply equals one process's chat, and /bye ends both ranks."""
    import shutil
    import subprocess
    import sys

    launcher = shutil.which("mlx.launch")
    if launcher is None:
        pytest.skip("mlx.launch is not on PATH")
    saved = tmp_path / "c.json"
    cmd = [launcher, "--backend", "ring", "-n", "2", "--python", sys.executable, "--", "-m", "mlx_spec.cli", "chat",
           *ARGS]
    out = subprocess.run(cmd, input=f"hello\n/save {saved}\n/bye\n", capture_output=True, text=True, timeout=240,
                         env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 ranks" in out.stdout + out.stderr
    conversation = json.loads(saved.read_text())["messages"]
    assert [m["content"] for m in conversation if m["role"] == "assistant"] == one_process(conversation, {0: 24})
