"""The --learn history store: off unless asked, capped, crash-safe; and the apps that write it."""

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

import mlx_spec
from mlx_spec.history import History, daily, recorder_from, target_key


@pytest.fixture(autouse=True)
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # never the real home
    return tmp_path / "data"


def test_recording_is_off_unless_asked(target_dir):
    from mlx_spec.app.chat import cli as chat_cli
    from mlx_spec.app.server import cli as server_cli

    for mod in (chat_cli, server_cli):
        p = argparse.ArgumentParser()
        mod.add_arguments(p)
        args = p.parse_args(["--model", str(target_dir)])
        assert recorder_from(args, target_dir) is None
        assert recorder_from(p.parse_args(["--model", str(target_dir), "--learn"]), target_dir) is not None
    assert server_cli.config_from(p.parse_args([])).learn.record is False


def test_store_round_trip_and_daily(tmp_path):
    h = History(tmp_path / "h")
    h.record([1, 2], [3, 4, 5], drafted=[2, 1], accepted=[2, 1], when=86400 * 2)
    h.record([1], [], when=86400 * 2)  # nothing generated: nothing kept
    h.record([7], [8, 9], when=86400 * 3)
    got = h.records()
    assert [(r.prompt, r.output) for r in got] == [([1, 2], [3, 4, 5]), ([7], [8, 9])]
    assert got[0].tau == 2.5 and got[1].tau is None
    assert got[0].sequence() == {"tokens": [1, 2, 3, 4, 5], "prompt_len": 2}
    days = daily(got)
    assert [d[1:] for d in days] == [(1, 3, 2.5), (1, 2, None)]


def test_store_respects_its_cap(tmp_path):
    h = History(tmp_path / "h", cap_bytes=20_000, segment_bytes=2_000)
    for i in range(400):
        h.record([i] * 10, [i] * 20)
        assert h.size_bytes() <= 20_000
    kept = [r.prompt[0] for r in h.records()]
    assert kept == list(range(kept[0], 400)) and kept[0] > 0  # the oldest went first, the rest in order
    assert len(kept) > 50


def test_torn_last_record_is_skipped_then_cut(tmp_path):
    h = History(tmp_path / "h", segment_bytes=1_000)
    for i in range(30):
        h.record([i], [i, i])
    with open(h.folder / "open.jsonl", "ab") as fh:
        fh.write(b'{"time": 1, "prompt": [99], "outp')  # a crash mid-append
    assert [r.prompt[0] for r in h.records()] == list(range(30))
    h.record([30], [30, 30])
    assert [r.prompt[0] for r in h.records()] == list(range(31))
    for f in h.folder.glob("*.jsonl"):  # every file of the set is whole JSON lines again
        assert all(json.loads(line) for line in f.read_text().splitlines())


WRITER = """
import sys
from mlx_spec.history import History
h = History(sys.argv[1], segment_bytes=3000)
i = 0
while True:
    h.record([i], list(range(50)))
    i += 1
"""


def test_history_survives_a_kill_mid_append(tmp_path):
    folder = tmp_path / "h"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)])
    try:
        deadline = time.monotonic() + 60
        while len(list(folder.glob("seg-*.jsonl"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    got = [r.prompt[0] for r in History(folder).records()]
    assert len(got) > 10 and got == list(range(len(got)))  # nothing lost but possibly the one in flight
    History(folder).record([-1], [1, 2])
    assert [r.prompt[0] for r in History(folder).records()] == got + [-1]


def test_history_command_shows_and_clears(target_dir, capsys):
    from mlx_spec.cli import main

    key = target_key(str(target_dir))
    History.for_target(key).record([1, 2], [3, 4], [1], [1])
    assert main(["history", "--model", str(target_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 requests" in out and "2.00" in out
    assert main(["history", "--model", str(target_dir), "--clear"]) == 0
    assert History.for_target(key).records() == []


def test_target_keys():
    from mlx_spec import models

    assert target_key(None) == target_key(str(models.DEFAULT_TARGET_8BIT)) == "mlx-spec-default"
    assert target_key("mlx-community/Qwen3-8B-4bit", models.DEFAULT_TARGET.parent / "x") == "qwen3-8b"


def test_chat_learn_records_each_reply(target_dir, drafter_dir, tmp_path):
    from mlx_spec.app.chat.prompt import LineInput
    from mlx_spec.app.chat.render import Output
    from mlx_spec.app.chat.repl import Chat
    from mlx_spec.app.chat.session import Session
    from mlx_spec.app.chat.settings import Settings
    from mlx_spec.app.chat.worker import Worker
    from mlx_spec.generate import encode_prompt

    model, tok = mlx_spec.load(target_dir, drafter=drafter_dir)
    store = History(tmp_path / "chat")
    out = Output()
    out.out, out.err = Console(file=io.StringIO()), Console(file=io.StringIO())
    chat = Chat(Session(model, tok), Worker(), LineInput(io.StringIO("hello\nhow are you\n")), out,
                Settings(max_tokens=8, block_size=4), recorder=store)  # a fixed block: it drafts on any machine
    assert chat.run() == 0
    got = store.records()
    assert len(got) == 2 and all(len(r.output) >= 1 for r in got)
    assert got[0].prompt == encode_prompt(tok, [{"role": "user", "content": "hello"}])
    assert got[1].prompt[: len(got[0].prompt)] == got[0].prompt  # the second turn's prompt holds the first
    assert got[0].drafted  # per-position counts of a speculative reply


def test_serve_learn_records_finished_requests(target_dir, drafter_dir):
    from test_server_harness import EOS_BIAS, RunningServer

    from mlx_spec.app.server.config import LearnConfig, ModelConfig, ServerConfig

    model = ModelConfig(target=str(target_dir), drafter=str(drafter_dir), block_size=4)  # drafts on any machine
    cfg = ServerConfig(model=model, learn=LearnConfig(record=True))
    server = RunningServer(cfg)
    try:
        client = server.client()
        r = client.completions.create(model="m", prompt="def add(a, b):", max_tokens=6, temperature=0,
                                      logit_bias=EOS_BIAS)
        store = server.state.scheduler.recorder
        deadline = time.monotonic() + 10
        while not store.records() and time.monotonic() < deadline:
            time.sleep(0.02)
        (rec,) = store.records()
        assert len(rec.output) == r.usage.completion_tokens == 6
        tok = server.state.tokenizer
        assert rec.prompt[-3:] == tok.encode("def add(a, b):", add_special_tokens=False)[-3:]
        assert rec.drafted and sum(rec.accepted) <= sum(rec.drafted)
    finally:
        server.stop()
