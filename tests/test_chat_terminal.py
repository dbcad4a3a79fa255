"""`mlx-spec chat` driven in a real terminal (tmux): what a user types, what the screen shows, exit codes.

Each test waits for screen content with a deadline instead of sleeping.
"""

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

STATS = re.compile(r"\d+ tok · [\d.]+ tok/s")
_ids = itertools.count()


def _prompts(screen: str) -> int:
    return sum(line.startswith(">>> ") for line in screen.splitlines())


def last_stats(screen: str) -> str:
    return [line for line in screen.splitlines() if STATS.search(line)][-1]


class Terminal:
    """One `mlx-spec chat` in its own tmux server; the pane stays after exit so the screen can be read."""

    def __init__(self, tmp_path, args, width=110, height=40):
        self.sock = f"mlxspec-{os.getpid()}-{next(_ids)}"
        conf = tmp_path / f"{self.sock}.conf"
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 5000\n")
        env = {"XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1", "NO_COLOR": ""}
        cmd = " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] +
                       [shlex.quote(sys.executable), "-m", "mlx_spec.cli", "chat", *map(shlex.quote, args)])
        # The shell records the exit status: tmux's own pane_dead_status is not always reaped in time.
        self.status = tmp_path / f"{self.sock}.status"
        self.tmux("-f", str(conf), "new-session", "-d", "-x", str(width), "-y", str(height), "-s", "chat",
                  f"env {cmd}; echo $? > {shlex.quote(str(self.status))}")

    def tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], check=True, capture_output=True, text=True).stdout

    def keys(self, *keys) -> None:
        self.tmux("send-keys", "-t", "chat", *keys)

    def type(self, text: str, enter=True) -> None:
        self.tmux("send-keys", "-t", "chat", "-l", text)
        if enter:
            self.keys("Enter")

    def paste(self, text: str) -> None:
        self.tmux("set-buffer", "-b", "p", text)
        self.tmux("paste-buffer", "-p", "-b", "p", "-t", "chat")  # -p: bracketed, when the app asks for it

    def screen(self, colors=False) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "chat", *(["-e"] if colors else []))

    def wait(self, test, timeout=30.0, what=""):
        """Poll the screen until test(screen) is truthy; fail with the screen if the deadline passes."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            found = test(screen) if callable(test) else (test in screen)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or test!r}; screen:\n{screen}")
            time.sleep(0.05)

    def ready(self, timeout=30.0) -> None:
        """The prompt is up and waiting: the last non-empty line is the empty prompt."""
        self.wait(lambda s: s.rstrip().splitlines()[-1].startswith(">>> Send a message") if s.strip() else False,
                  timeout, "an empty prompt")

    def send(self, text: str) -> str:
        """Type a line at the prompt and wait until the chat is ready again; returns what it printed."""
        self.ready()
        screen = self.screen().rstrip()
        before, prompts = screen.rpartition("\n")[0], _prompts(screen)
        self.type(text)
        self.wait(lambda s: _prompts(s) > prompts and s.rstrip().splitlines()[-1].startswith(">>> Send a message"),
                  what=f"the answer to {text!r}")
        return self.screen().rstrip()[len(before):]

    def exit_status(self, timeout=15.0) -> int:
        self.wait(lambda s: self.status.exists() and self.status.read_text().strip(), timeout, "the chat to exit")
        return int(self.status.read_text())

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


@pytest.fixture
def chat(tmp_path, target_dir, drafter_dir):
    opened = []

    def start(*extra, model=True):
        args = ["--model", str(target_dir), "--drafter", str(drafter_dir), "--max-tokens", "24", *extra] if model \
            else list(extra)
        t = Terminal(tmp_path, args)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_conversation_two_turns_then_ctrl_c_mid_reply(chat, tmp_path):
    t = chat()
    t.wait("plain decoding", what="the banner")
    first = t.send("hello")
    assert len(STATS.findall(first)) == 1 and "(0 cached)" in first
    second = t.send("tell me more")
    cached = int(re.search(r"\((\d+) cached\)", second).group(1))
    assert cached > 20  # the first turn's prompt and reply were not prefilled again
    t.send("/set max_tokens 400")
    t.type("now a very long story")
    # Stop as soon as the reply has started streaming: something follows the input line.
    t.wait(lambda s: s.rstrip().partition(">>> now a very long story\n")[2].strip(), what="the reply to start")
    t.keys("C-c")
    t.ready(timeout=10)
    assert last_stats(t.screen()).endswith("· stopped")
    f = tmp_path / "c.json"
    t.send(f"/save {f}")
    messages = json.loads(f.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    assert messages[-1]["content"]  # the partial reply was kept
    t.send("and after that?")  # the conversation goes on from the partial reply
    t.type("/bye")
    assert t.exit_status() == 0
    assert "Traceback" not in t.screen()


def test_every_slash_command_and_bad_input(chat, tmp_path):
    t = chat()
    out = t.send("/help")
    assert "/draft [on|off]" in out and "Ctrl-C" in out
    assert "/set [KEY [VALUE]]" in t.send("/?")
    assert "target" in t.send("/model") and "block size 8" in t.screen()
    assert "temp = 0.5" in t.send("/set temp 0.5")
    assert "temp needs a number, not 'hot'" in t.send("/set temp hot")
    assert "top_p must be in (0, 1]" in t.send("/set top_p 7")
    assert "no setting 'colour'" in t.send("/set colour red")
    assert "block size must be an integer from 1 to 8" in t.send("/set block_size 99")
    assert "temp        0.5" in t.send("/set")
    assert "unknown command /frobnicate" in t.send("/frobnicate")
    assert "/bye takes no arguments" in t.send("/bye now")
    assert "system message set" in t.send("/system You answer in one line.")
    assert "system: You answer in one line." in t.send("/system")
    assert "plain decoding: the next replies" in t.send("/draft off")
    assert "plain decoding" in last_stats(t.send("hello"))
    assert "speculative decoding, block size auto (up to 8)" in t.send("/draft on")
    assert "/draft takes on or off" in t.send("/draft maybe")
    assert len(STATS.findall(t.send("/regen"))) == 1
    stats = t.send("/stats")
    assert "acceptance by draft position" in stats and "round cost / plain step" in stats
    f = tmp_path / "saved.json"
    assert "saved 3 messages" in t.send(f"/save {f}")
    assert "new conversation (system message kept)" in t.send("/clear")
    assert "nothing to regenerate yet" in t.send("/regen")
    assert "loaded 2 messages" in t.send(f"/load {f}")
    assert "no such file" in t.send(f"/load {tmp_path}/nope.json")
    (tmp_path / "bad.json").write_text("{oops")
    assert "not a saved conversation: not valid JSON" in t.send(f"/load {tmp_path}/bad.json")
    assert "live view" in t.send("/set verbose")
    t.send("one more")
    t.type("/quit")
    assert t.exit_status() == 0
    assert "Traceback" not in t.screen()


def test_multiline_paste_completion_and_ctrl_c_on_the_line(chat, tmp_path):
    t = chat()
    t.ready()
    t.type('"""first line')
    t.type('second line"""', enter=False)
    t.wait("... second line", what="the continuation prompt")
    t.keys("Enter")
    t.ready()
    t.paste("pasted one\npasted two")
    t.wait("... pasted two", what="the pasted lines")
    assert len(STATS.findall(t.screen())) == 1  # a paste is not sent until Enter
    t.keys("Enter")
    t.wait(lambda s: len(STATS.findall(s)) == 2, what="the reply to the paste")
    f = tmp_path / "m.json"
    t.send(f"/save {f}")
    users = [m["content"] for m in json.loads(f.read_text())["messages"] if m["role"] == "user"]
    assert users == ["first line\nsecond line", "pasted one\npasted two"]
    t.ready()
    t.type("/mo", enter=False)
    t.keys("Tab")
    t.wait(">>> /model", what="completion of /mo")
    t.keys("Enter")
    t.wait("decoding speculative")
    t.ready()
    t.type("/set verb", enter=False)
    t.keys("Tab")
    t.wait(">>> /set verbose", what="completion of /set verb")
    t.keys("C-c")  # drops the typed line, keeps the chat
    t.ready()
    assert "verbose = on" not in t.screen()
    t.keys("C-d")
    assert t.exit_status() == 0


def test_ctrl_c_on_an_empty_line_or_after_a_reply_does_not_leave(chat, tmp_path):
    t = chat("--baseline-tokens", "0")
    t.ready()
    t.keys("C-c")  # at the empty prompt: a hint, as ollama gives, not an exit
    t.wait("Use Ctrl-D or /bye to exit", what="the exit hint")
    t.ready()
    assert not t.status.exists()
    t.send("hello")
    t.keys("C-c")  # meant to stop the reply, but it has already ended
    t.wait(lambda s: s.count("Use Ctrl-D or /bye to exit") == 2, what="the second hint")
    t.keys("C-c")
    t.wait(lambda s: s.count("Use Ctrl-D or /bye to exit") == 3, what="the third hint")
    f = tmp_path / "kept.json"
    t.send(f"/save {f}")  # the conversation survived
    assert [m["role"] for m in json.loads(f.read_text())["messages"]] == ["user", "assistant"]
    assert not t.status.exists()
    t.type("/bye")
    assert t.exit_status() == 0
    assert "Traceback" not in t.screen()


def test_history_persists_and_ctrl_d_exits(chat):
    t = chat("--baseline-tokens", "0")
    t.send("/model")
    t.keys("C-d")
    assert t.exit_status() == 0
    again = chat("--baseline-tokens", "0")
    again.ready()
    again.keys("Up")
    again.wait(">>> /model", what="the previous session's input")
    again.keys("Enter")
    again.wait("decoding speculative", what="/model from history")
    again.ready()
    again.keys("C-r")
    again.type("mod", enter=False)
    again.wait(lambda s: [x.rstrip() for x in s.splitlines() if x.startswith(">>> ")][-1] == ">>> /model"
               and "I-search backward: mod" in s, what="the history search")
    again.keys("Enter")  # takes the match into the line
    again.keys("Enter")  # sends it
    again.wait(lambda s: s.count("decoding speculative") == 2, what="/model found by Ctrl-R")
    again.ready()
    again.keys("C-d")
    assert again.exit_status() == 0


def test_show_drafts_legend(chat):
    t = chat("--show-drafts", "--no-markdown")
    t.wait("live view: accepted draft tokens")
    t.send("hi")
    lines = t.screen(colors=True).splitlines()
    reply = lines[next(i for i, x in enumerate(lines) if x.endswith(">>> hi")) + 1]
    assert reply.startswith("\x1b[1m")  # a random drafter gets nothing accepted: every token is the target's
    t.keys("C-d")
    assert t.exit_status() == 0


def _run(args, stdin=""):
    return subprocess.run([sys.executable, "-m", "mlx_spec.cli", "chat", *args], input=stdin, capture_output=True,
                          text=True, timeout=60)


def test_exit_codes_without_a_terminal(target_dir, drafter_dir, tmp_path):
    r = _run(["--model", str(tmp_path / "missing")])
    assert r.returncode == 2 and r.stderr.startswith("error: no model folder") and "Traceback" not in r.stderr
    r = _run(["--model", str(target_dir), "--block-size", "0"])
    assert r.returncode == 2 and "block_size must be at least 1" in r.stderr
    r = _run(["--bogus-flag"])
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr
    # Piped input: the same commands, one line each; EOF leaves cleanly.
    r = _run(["--model", str(target_dir), "--drafter", str(drafter_dir), "--max-tokens", "8", "--baseline-tokens", "0"],
             stdin='hello\n"""two\nlines"""\n/set temp x\n/stats\n')
    assert r.returncode == 0, r.stderr
    assert len(STATS.findall(r.stderr)) == 2 and "temp needs a number" in r.stderr and "acceptance" in r.stdout
