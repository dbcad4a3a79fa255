"""The chat loop: read input, run a slash command or a reply turn, print the stats line."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_spec.errors import ContextOverflowError, MlxSpecError
from mlx_spec import SpecStats
from mlx_spec.generate import encode_prompt

from .commands import CommandError, is_command, parse
from .conversation import Conversation
from .handlers import EXIT, HANDLERS
from .prompt import EXIT_HINT, EmptyInterrupt, message_text
from .render import Output, ReplyWriter
from .session import Session
from .settings import Settings
from .stats import Turn, stats_line
from .worker import STOPPING, Worker


class Quit(Exception):
    """Leave now with this exit code, even though the worker may still be busy (second Ctrl-C)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@dataclass
class Chat:
    session: Session
    worker: Worker
    reader: object  # TerminalInput or LineInput
    out: Output
    settings: Settings
    conversation: Conversation = field(default_factory=Conversation)
    last: Turn | None = None  # the latest reply's numbers, for /stats
    total: SpecStats = field(default_factory=SpecStats)
    recorder: object | None = None  # a `mlx_spec.history.History` under --learn: each reply's token ids go there

    def run(self) -> int:
        while True:
            try:
                line = self.reader.read()
            except EOFError:
                return 0
            except EmptyInterrupt:
                self.out.hint(EXIT_HINT)
                continue
            try:
                if self.handle(line) is EXIT:
                    return 0
            except KeyboardInterrupt:  # Ctrl-C while a command ran (a reply stops without this)
                self.out.hint("interrupted")

    def handle(self, line: str):
        if not line.strip():
            return None
        if is_command(line):
            try:
                cmd = parse(line)
            except CommandError as e:
                self.out.hint(str(e))
                return None
            return HANDLERS[cmd.name](self, *cmd.args)
        message = message_text(line)
        return self.ask(message) if message.strip() else None

    def ask(self, message: str) -> None:
        """Send a typed message. If no reply came at all, the message leaves the conversation again."""
        self.conversation.add("user", message)
        replied = False
        try:
            replied = self.turn()
        finally:  # also on a Ctrl-C that came before the reply's stream took charge of Ctrl-C
            if not replied and self.conversation.last("user"):
                self.conversation.pop()
                self.out.note("(the message was not kept; ↑ brings it back)")

    def turn(self) -> bool:
        """Reply to the conversation as it stands; a stopped reply is kept as far as it got.

        Returns whether a reply joined the conversation.
        """
        settings, messages = self.settings, self.conversation.messages()
        turn = Turn(speculative=self.session.speculative)
        committed: list[int] = []  # the reply's token ids, for --learn
        writer = ReplyWriter(self.out, self.session.tokenizer, settings.markdown, settings.verbose)
        try:
            with self.reader.busy(), self.worker.stream(lambda: self.session.reply(messages, settings)) as stream:
                for r in stream:
                    if r is STOPPING:
                        writer.interject("stopping after this round… (Ctrl-C again to quit)")
                        continue
                    writer.feed(r)
                    turn.add(r)
                    committed += r.tokens
        except KeyboardInterrupt:
            writer.finish()
            raise Quit(130) from None
        except ContextOverflowError as e:
            return self._failed(writer, f"{e}: /clear starts over (/save keeps this one)")
        except MlxSpecError as e:
            return self._failed(writer, str(e))
        except Exception as e:  # a bug below us: say it in one line, keep the session usable
            self.worker.call(self.session.forget_caches)
            return self._failed(writer, f"generation failed: {type(e).__name__}: {e}", error=True)
        return self._finish(turn, writer.finish(), stopped=stream.stopped and turn.finish is None,
                            record=(messages, committed))

    def _finish(self, turn: Turn, text: str, stopped: bool, record=None) -> bool:
        if stopped and not text:
            self.out.hint("stopped before the reply began")
            return False
        if self.recorder is not None and record is not None:
            messages, committed = record
            self.recorder.record_generation(encode_prompt(self.session.tokenizer, messages), committed,
                                            turn.spec if turn.speculative else None)
        self.conversation.add("assistant", text)
        if not turn.speculative and not stopped:
            self.session.note_plain_run(turn.tokens, turn.tps)
        self.last = turn
        self.total.merge(turn.spec)
        self.out.note(stats_line(turn, self.session.baseline_tps))
        self.out.say()
        return True

    def _failed(self, writer: ReplyWriter, message: str, error: bool = False) -> bool:
        writer.finish()
        (self.out.error if error else self.out.hint)(message)
        return False
