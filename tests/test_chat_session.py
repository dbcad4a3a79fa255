"""The chat loop in-process on the tiny test pair: turns, prefix reuse, draft on/off, stop, files, errors."""

import io
import json
import signal

import pytest
from rich.console import Console

import mlx_spec
from mlx_spec.app.chat import repl
from mlx_spec.app.chat.prompt import LineInput
from mlx_spec.app.chat.render import Output, ReplyWriter
from mlx_spec.app.chat.repl import Chat
from mlx_spec.app.chat.session import Session
from mlx_spec.app.chat.settings import Settings
from mlx_spec.app.chat.worker import Worker


@pytest.fixture(scope="module")
def pair(target_dir, drafter_dir):
    return mlx_spec.load(target_dir, drafter=drafter_dir)


def run_chat(pair, lines, max_tokens=12, baseline=None):
    model, tokenizer = pair
    session = Session(model, tokenizer)
    session.set_drafting(True)
    session.baseline_tps = baseline
    out = Output()
    kw = dict(width=100, highlight=False, markup=False, emoji=False, soft_wrap=True)
    out.out, out.err = Console(file=io.StringIO(), **kw), Console(file=io.StringIO(), **kw)
    chat = Chat(session, Worker(), LineInput(io.StringIO("".join(f"{x}\n" for x in lines))), out,
                Settings(max_tokens=max_tokens))
    try:
        assert chat.run() == 0
    finally:
        chat.worker.call(lambda: None)  # the worker is idle again before the next test uses the model
    chat.stdout, chat.stderr = out.out.file.getvalue(), out.err.file.getvalue()
    assert "Traceback" not in chat.stdout + chat.stderr
    return chat


def replies(chat):
    return [m["content"] for m in chat.conversation.turns if m["role"] == "assistant"]


def test_two_turns_reuse_the_cached_prefix(pair):
    chat = run_chat(pair, ["hello", "and a follow-up"], baseline=100.0)
    assert [m["role"] for m in chat.conversation.turns] == ["user", "assistant"] * 2
    assert chat.last.cached_tokens > 0 and chat.last.tokens == 12
    lines = [x for x in chat.stderr.splitlines() if "tok/s" in x]
    assert len(lines) == 2 and "(0 cached)" in lines[0] and " τ " in lines[1] and "plain (est.)" in lines[1]


@pytest.fixture
def printed(monkeypatch):
    """Every reply as the writer printed it, including ones /regen later replaced."""
    seen = []

    class Recording(ReplyWriter):
        def finish(self):
            seen.append(super().finish())
            return seen[-1]

    monkeypatch.setattr(repl, "ReplyWriter", Recording)
    return seen


def test_draft_off_gives_the_same_greedy_reply(pair, printed):
    chat = run_chat(pair, ["hi there", "/draft off", "/regen", "/draft on", "/regen", "/draft"])
    assert len(replies(chat)) == 1 and len(printed) == 3
    assert printed[0] == printed[1] == printed[2]  # lossless: speculation never changes a greedy reply
    stats = [x for x in chat.stderr.splitlines() if "tok/s" in x]
    assert "τ" in stats[0] and "plain decoding" in stats[1] and "τ" in stats[2]
    assert "plain decoding: the next replies" in chat.stdout
    assert chat.stdout.rstrip().endswith("speculative decoding, block size auto (up to 8)")


def test_stop_keeps_the_partial_reply_and_the_cache_stays_exact(pair, monkeypatch):
    class CtrlCAfterTwo(ReplyWriter):
        def feed(self, r):
            super().feed(r)
            self.n = getattr(self, "n", 0) + 1
            if self.n == 2:
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(repl, "ReplyWriter", CtrlCAfterTwo)
    chat = run_chat(pair, ["write a long story"], max_tokens=200)
    partial = replies(chat)[0]
    assert chat.last.finish is None and 0 < chat.last.tokens < 200
    assert "stopped" in chat.stderr
    # The next turn reuses the cache left by the stop; greedy output must equal a fresh run.
    monkeypatch.setattr(repl, "ReplyWriter", ReplyWriter)
    model, tokenizer = pair
    chat.reader = LineInput(io.StringIO("go on\n"))
    chat.settings = Settings(max_tokens=16)
    chat.run()
    assert chat.last.cached_tokens > 0
    messages = [{"role": "user", "content": "write a long story"}, {"role": "assistant", "content": partial},
                {"role": "user", "content": "go on"}]
    assert replies(chat)[1] == mlx_spec.generate(model, tokenizer, messages, 16)


def test_save_load_and_conversation_commands(pair, tmp_path):
    f = tmp_path / "chat.json"
    chat = run_chat(pair, ["/system Be brief.", "/system", "hello", f"/save {f}", "/clear", "/regen",
                           f"/load {f}", "/load /no/such/file.json", f"/save {tmp_path}/missing/dir/x.json"])
    data = json.loads(f.read_text())
    assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
    assert chat.conversation.messages() == data["messages"]
    out, err = chat.stdout, chat.stderr
    assert "system: Be brief." in out and "saved 3 messages" in out and "new conversation (system message kept)" in out
    assert "nothing to regenerate yet" in err and "loaded 2 messages" in out
    assert "no such file" in err and "cannot save to" in err


def test_settings_and_bad_values(pair):
    chat = run_chat(pair, ["/set temp 0.5", "/set top_p 2", "/set block_size 99", "/set block_size 4", "/set",
                           "/model", "/stats", "/help", "/help set", "/nope"])
    assert chat.settings.sampling.temperature == 0.5 and chat.settings.block_size == 4
    assert "top_p must be in (0, 1] (still 1.0)" in chat.stderr
    assert "block size must be an integer from 1 to 8" in chat.stderr
    assert "unknown command /nope" in chat.stderr
    assert "decoding speculative, block size 4" in chat.stdout
    assert "no drafts yet" in chat.stdout and "verify cost t(M)/t(1), M = 1…: 1.00 " in chat.stdout
    assert "round cost / plain step, k = 0… drafts: 1.00 " in chat.stdout
    assert "/draft [on|off]" in chat.stdout and "max_tokens  longest reply" in chat.stdout


def test_model_names_the_short_blocks_a_drafter_learnt(pair, monkeypatch):
    """A drafter trained with --sub-blocks lists them in its config, in whatever order it was written."""
    from dataclasses import replace

    from mlx_spec.drafters import model_drafter

    inner = model_drafter(pair[0].drafter)
    monkeypatch.setattr(inner, "config", replace(inner.config, block_sizes=[8, 4, 2]))
    assert "block size 8 (short drafts from 2, 4)" in run_chat(pair, ["/model"]).stdout
    monkeypatch.setattr(inner, "config", replace(inner.config, block_sizes=None))
    out = run_chat(pair, ["/model"]).stdout
    assert "block size 8" in out and "short drafts" not in out


def test_context_overflow_is_a_hint(pair):
    chat = run_chat(pair, ["word " * 600, "/stats"])
    assert "does not fit the context window" in chat.stderr and "/clear" in chat.stderr
    assert chat.conversation.turns == []


def test_bye_ends_the_chat(pair):
    chat = run_chat(pair, ["/bye", "never read"])
    assert chat.conversation.turns == []


def test_second_ctrl_c_quits_with_130(pair, monkeypatch):
    class TwoCtrlC(ReplyWriter):
        def feed(self, r):
            super().feed(r)
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(repl, "ReplyWriter", TwoCtrlC)
    with pytest.raises(repl.Quit) as e:
        run_chat(pair, ["write a long story"], max_tokens=200)
    assert e.value.code == 130
