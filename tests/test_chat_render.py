"""The chat's output pieces and its Ctrl-C machinery, without a model: streaming render, stats, worker."""

import io
import re
import signal
import threading
from types import SimpleNamespace

import pytest
from rich.console import Console

from mlx_spec.app.chat.markdown import MarkdownLines, inline
from mlx_spec.app.chat.render import Output, ReplyWriter, printable, screen_rows
from mlx_spec.app.chat.stats import Turn, estimate_speedup, report, stats_line
from mlx_spec.app.chat.worker import Worker
from mlx_spec.curve import CostCurve
from mlx_spec.generate import SpecStats

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def console_output(tty=True, width=40):
    out = Output()
    out.out = Console(file=io.StringIO(), force_terminal=tty, width=width, height=20, color_system="standard" if tty
                      else None, highlight=False, markup=False, emoji=False, soft_wrap=True)
    return out


def chunk(text, tokens=(), accepted=0):
    return SimpleNamespace(text=text, tokens=list(tokens), accepted=accepted)


REPLY = "Use **open**:\n```python\nwith open(p) as f:\n    data = f.read()\n```\n- one `item`\n"


@pytest.mark.parametrize("cut", [1, 3, 7, 1000])
def test_markdown_reply_is_restyled_line_by_line(cut):
    out = console_output()
    w = ReplyWriter(out, tokenizer=None, markdown=True, show_drafts=False)
    for i in range(0, len(REPLY), cut):
        w.feed(chunk(REPLY[i:i + cut]))
    assert w.finish() == REPLY  # the conversation keeps the Markdown source
    raw = out.out.file.getvalue()
    assert "\x1b[J" in raw  # streamed lines were erased and redrawn
    screen = ANSI.sub("", raw)
    assert "Use open:" in screen and "**" not in screen.split("\r")[-1]
    assert "• one item" in screen
    assert "\x1b[1m" in raw  # bold


def test_plain_output_when_not_a_terminal():
    out = console_output(tty=False)
    w = ReplyWriter(out, tokenizer=None, markdown=True, show_drafts=False)
    for piece in ("Use **open**", ":\nok"):
        w.feed(chunk(piece))
    w.finish()
    assert out.out.file.getvalue() == "Use **open**:\nok\n"


def test_show_drafts_colours_by_origin():
    out = console_output()
    tok = SimpleNamespace(decode=lambda ids: {(3,): "C"}.get(tuple(ids), "?"))
    w = ReplyWriter(out, tokenizer=tok, markdown=True, show_drafts=True)
    w.feed(chunk("ABC", tokens=[1, 2, 3], accepted=2))  # A and B were drafted and accepted, C came from the target
    w.finish()
    raw = out.out.file.getvalue()
    assert "\x1b[32mAB" in raw and "\x1b[1mC" in raw


def test_control_characters_cannot_drive_the_terminal():
    assert printable("a\x1b[2Jb\x07\tc\n") == "a␛[2Jb␇    c\n"


@pytest.mark.parametrize("line, rows", [
    ("", 1), ("a" * 80, 1), ("a" * 81, 2), ("é–’…→" * 20, 2),
    ("日本" * 50, 3), ("a" + "日" * 40, 2),  # a wide character that would straddle the edge wraps early
    ("👍 ok", 1), ("x\u035e" * 50, None), ("👍" * 40, None),  # terminals disagree: only a sure single row
])
def test_screen_rows_only_when_the_terminal_surely_agrees(line, rows):
    assert screen_rows(line, 80) == rows


def test_markdown_lines():
    m = MarkdownLines()
    assert m.feed("# Title").plain == "Title"
    assert m.feed("* x and `y`").plain == "• x and y"
    assert m.feed("> quoted").plain == "▌ quoted"
    assert m.feed("```py").plain == "```py"
    assert m.feed("# comment, not a heading").plain == "# comment, not a heading"
    assert m.feed("```").plain == "```"
    assert m.feed("snake_case_name stays").plain == "snake_case_name stays"
    assert inline("see [docs](https://x.org) and **b**").plain == "see docs (https://x.org) and b"


def _turn(accepted_per_round, drafted=3, finish="stop", tps=100.0, tokens=40):
    t = Turn(speculative=True)
    t.add(SimpleNamespace(generation_tokens=1, generation_tps=0.0, time_to_first_token=0.05, prompt_tokens=10,
                          cached_tokens=4, finish_reason=None, drafted=0, accepted=0))
    for a in accepted_per_round:
        t.add(SimpleNamespace(generation_tokens=tokens, generation_tps=tps, time_to_first_token=0.05, prompt_tokens=10,
                              cached_tokens=4, finish_reason=finish, drafted=drafted, accepted=a))
    return t


def test_stats_line_and_report():
    t = _turn([3, 1, 0])
    assert t.spec.rounds == 3 and t.spec.tau == pytest.approx((4 + 3) / 3)
    line = stats_line(t, baseline_tps=50.0)
    assert "40 tok" in line and "100.0 tok/s" in line and "TTFT 50 ms" in line and "(4 cached)" in line
    assert "τ 2.33" in line and "2.00× plain (est.)" in line
    assert "stopped" in stats_line(_turn([1], finish=None), 50.0)
    assert "speedup n/a" in stats_line(t, None)
    total = SpecStats()
    total.merge(t.spec)
    total.merge(_turn([3]).spec)
    assert total.rounds == 4 and total.drafting_rounds == 4 and total.accepted_per_position == [3, 2, 2]
    text = "\n".join(report(t, total, 50.0))
    assert "acceptance by draft position" in text and "50.0 tok/s" in text and "verify cost" not in text
    curve = CostCurve(verify=[1.0, 1.5, 2.0], draft=[0.1, 0.2], rounds=[1.0, 1.8, 2.5])
    text = "\n".join(report(t, total, 50.0, curve))
    assert "verify cost t(M)/t(1), M = 1…: 1.00 1.50 2.00" in text and "k = 0… drafts: 1.00 1.80 2.50" in text
    assert estimate_speedup(200, 100) == 2.0 and estimate_speedup(200, None) is None


def _counting(gate: threading.Event, closed: list):
    def gen():
        try:
            i = 0
            while True:
                yield i
                i += 1
                gate.wait()  # later items wait until the test has pressed Ctrl-C
        finally:
            closed.append(True)
    return gen


def test_ctrl_c_stops_a_stream_between_items():
    worker, gate, closed, seen = Worker(), threading.Event(), [], []
    with worker.stream(_counting(gate, closed)) as stream:
        for item in stream:
            seen.append(item)
            if item == 0:
                signal.raise_signal(signal.SIGINT)  # handled: no KeyboardInterrupt, the stream is asked to stop
                gate.set()
    assert stream.stopped and seen[0] == 0 and len(seen) <= 2
    assert worker.call(lambda: closed) == [True]  # the generator was closed on the worker
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_second_ctrl_c_raises():
    worker, gate = Worker(), threading.Event()
    with pytest.raises(KeyboardInterrupt), worker.stream(_counting(gate, [])) as stream:
        for _ in stream:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
    gate.set()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_worker_call_returns_and_raises():
    worker = Worker()
    assert worker.call(lambda x: x + 1, 1) == 2
    assert worker.call(threading.current_thread).name == "mlx-spec-chat-worker"
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
