"""Reading what the user types: prompt_toolkit on a terminal, plain lines from a pipe.

Both read `\"\"\"` blocks as one multi-line message; on a terminal, a bracketed paste is one
message too, Tab completes commands, and history persists across sessions.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.application import get_app
from prompt_toolkit.completion import Completer, Completion, PathCompleter
from prompt_toolkit.document import Document
from prompt_toolkit.filters import is_searching
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

from .commands import BY_NAME, complete, is_command, unquote

PROMPT = ">>> "
CONTINUATION = "... "
PLACEHOLDER = "Send a message (/? for help)"
EXIT_HINT = "Use Ctrl-D or /bye to exit"


class EmptyInterrupt(Exception):
    """Ctrl-C on an empty line: not a way out (a Ctrl-C meant for a reply that just ended lands here)."""


def default_history() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "mlx-spec" / "chat_history"


def open_block(text: str) -> bool:
    """True while a \"\"\" block is still open: Enter then starts a new line instead of sending."""
    return text.count('"""') % 2 == 1


def message_text(text: str) -> str:
    """The message in a line: the inside of a \"\"\" block, or '//x' sent as '/x'."""
    if text.lstrip().startswith('"""'):
        return unquote(text.strip() + ('"""' if open_block(text) else ""))
    return text[1:] if text.startswith("//") else text


class TerminalInput:
    def __init__(self, history: Path | None):
        self.warning = None
        store = InMemoryHistory()
        if history is not None:
            try:
                history.parent.mkdir(parents=True, exist_ok=True)
                history.touch(mode=0o600, exist_ok=True)  # prompts can be private
                store = FileHistory(str(history))
            except OSError as e:
                self.warning = f"history not saved: cannot write {history} ({e.strerror})"
        self.session = PromptSession(
            history=store, completer=SlashCompleter(), key_bindings=_bindings(), multiline=True,
            prompt_continuation=CONTINUATION, complete_while_typing=False,
            placeholder=_placeholder,
        )

    def read(self) -> str:
        """The next input; '' when Ctrl-C discarded a line. Raises EOFError to leave, EmptyInterrupt
        for a Ctrl-C on an empty line."""
        try:
            return self.session.prompt(PROMPT)
        except KeyboardInterrupt:
            return ""

    @contextmanager
    def busy(self):
        """While a reply streams, keystrokes are not echoed over it (they wait for the next prompt)."""
        with _no_echo(sys.stdin):
            yield


class LineInput:
    """Plain lines from a pipe or a file: the same commands and \"\"\" blocks, no editing."""

    warning = None

    def __init__(self, stream=None):
        self.stream = stream or sys.stdin

    def read(self) -> str:
        line = self.stream.readline()
        if not line:
            raise EOFError
        text = line.rstrip("\n")
        while open_block(text):
            more = self.stream.readline()
            if not more:
                break
            text += "\n" + more.rstrip("\n")
        return text

    def busy(self):
        return nullcontext()


def _placeholder():
    # Hidden while Ctrl-R searches: the match is drawn in the still-empty buffer.
    return [] if get_app().layout.is_searching else [("fg:ansibrightblack", PLACEHOLDER)]


def _bindings() -> KeyBindings:
    kb = KeyBindings()

    editing = ~is_searching  # while Ctrl-R searches, prompt_toolkit's own keys apply

    @kb.add("enter", filter=editing)
    @kb.add("c-j", filter=editing)  # a line typed ahead while a reply streamed arrives ending in c-j
    def _(event):
        buf = event.current_buffer
        if open_block(buf.text):
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()

    @kb.add("escape", "enter", filter=editing)
    def _(event):
        event.current_buffer.insert_text("\n")

    @kb.add("c-c", filter=editing)
    def _(event):
        # Ctrl-C drops a typed line; on an empty line it only says how to leave (as ollama does).
        exc = KeyboardInterrupt if event.current_buffer.text else EmptyInterrupt
        event.app.exit(exception=exc, style="class:aborting")

    return kb


class SlashCompleter(Completer):
    """Command names, settings and on/off values from the command table; file paths for /save and /load."""

    def __init__(self):
        self.paths = PathCompleter(expanduser=True)

    def get_completions(self, document, complete_event):
        text = document.text_before_cursor
        if not is_command(text) or "\n" in text:
            return
        head, space, rest = text.partition(" ")
        spec = BY_NAME.get(head[1:].lower())
        if space and spec is not None and spec.args == "path":
            yield from self.paths.get_completions(Document(rest, len(rest)), complete_event)
            return
        word = text.rpartition(" ")[2]
        for c in complete(text):
            yield Completion(c, start_position=-len(word))


@contextmanager
def _no_echo(stream):
    try:
        import termios  # POSIX only

        fd = stream.fileno()
        old = termios.tcgetattr(fd)
    except Exception:  # no terminal to quiet: termios.error, ImportError, a closed or fake stream
        yield
        return
    new = list(old)
    new[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, new)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, old)
