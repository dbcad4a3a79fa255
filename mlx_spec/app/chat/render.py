"""Printing: the reply as it streams (styled line by line, or coloured by origin), notes and hints.

The reply goes to stdout; stats lines, hints and errors go to stderr, as with `mlx-spec generate`.
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.text import Text

from .markdown import MarkdownLines

DRAFT_STYLE = "green"  # draft tokens the target accepted
TARGET_STYLE = "bold"  # tokens the target produced itself (a correction or the bonus token)


def legend() -> Text:
    return Text.assemble("live view: ", ("accepted draft tokens", DRAFT_STYLE), " · ",
                         ("tokens from the target", TARGET_STYLE))


class Output:
    """Model text is never read as rich markup or emoji codes, and never wrapped by rich."""

    def __init__(self):
        opts = dict(highlight=False, markup=False, emoji=False, soft_wrap=True)
        self.out = Console(**opts)
        self.err = Console(stderr=True, **opts)

    @property
    def tty(self) -> bool:
        return self.out.is_terminal

    def say(self, text: str | Text = "", style: str = "") -> None:
        self.out.print(text, style=style)

    def note(self, text: str) -> None:
        self.err.print(text, style="dim")

    def hint(self, text: str) -> None:
        self.err.print(text, style="yellow")

    def error(self, text: str) -> None:
        self.err.print(f"error: {text}", style="red")


class ReplyWriter:
    """Streams one reply. With Markdown on, each finished line is erased and redrawn styled."""

    def __init__(self, out: Output, tokenizer, markdown: bool, show_drafts: bool):
        self.console, self.tokenizer, self.show_drafts = out.out, tokenizer, show_drafts
        styled = markdown and out.tty and not show_drafts
        self.styler = MarkdownLines(width=self._terminal_size()[0]) if styled else None
        self.parts: list[str] = []
        self.line = ""  # the unfinished line, as it stands on screen

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, r) -> None:
        if not r.text:
            return
        self.parts.append(r.text)
        shown = printable(r.text)
        if self.show_drafts:
            self._write_by_origin(r, shown)
        elif self.styler is None:
            self._write(shown)
        else:
            *done, rest = shown.split("\n")
            for piece in done:
                self._redraw(self.line + piece)
            self._write(rest)
        self.line = shown.rpartition("\n")[2] if "\n" in shown else self.line + shown

    def interject(self, text: str) -> None:
        """A note in the middle of a reply, on a line of its own."""
        self._end_line()
        self.console.print(text, style="dim")

    def finish(self) -> str:
        if self.styler is not None and self.line:
            self._redraw(self.line)
        self._end_line()
        return self.text

    def _end_line(self) -> None:
        if self.line:
            self._write("\n")
            self.line = ""

    def _write(self, s: str, style: str = "") -> None:
        if s:
            self.console.print(s, style=style, end="")

    def _redraw(self, line: str) -> None:
        styled = self.styler.feed(line)
        width, height = self._terminal_size()
        rows = screen_rows(self.line, width)
        if rows is not None and rows < height:
            self.console.file.write("\r" + (f"\x1b[{rows - 1}A" if rows > 1 else "") + "\x1b[J")
            self.console.print(styled)
        else:  # erasing could hit the lines above: leave this one as it streamed
            self._write(line[len(self.line):] + "\n")
        self.line = ""

    def _terminal_size(self) -> tuple[int, int]:
        # Asked each time, from the terminal itself: rich trusts $COLUMNS, which can be stale.
        try:
            size = os.get_terminal_size(self.console.file.fileno())
            return max(size.columns, 1), size.lines
        except (OSError, ValueError, AttributeError):
            return max(self.console.width, 1), self.console.height

    def _write_by_origin(self, r, shown: str) -> None:
        """The first `accepted` tokens of a round came from the drafter, the rest from the target."""
        n_draft = min(r.accepted, len(r.tokens))
        target = printable(self.tokenizer.decode(r.tokens[n_draft:])) if r.tokens[n_draft:] else ""
        if n_draft and target and shown.endswith(target):
            self._write(shown[: len(shown) - len(target)], DRAFT_STYLE)
            self._write(target, TARGET_STYLE)
        else:
            self._write(shown, DRAFT_STYLE if n_draft and not target else TARGET_STYLE)


# Control characters from a model would drive the terminal: show them as their Unicode pictures.
# Tabs become spaces, so a redraw knows how many rows a line took.
_PICTURES = {c: 0x2400 + c for c in range(32) if c not in (9, 10)} | {127: 0x2421, 9: " " * 4}
_PICTURES |= {c: 0xFFFD for c in range(0x80, 0xA0)}


def printable(text: str) -> str:
    return text.replace("\r\n", "\n").translate(_PICTURES)


def screen_rows(line: str, width: int) -> int | None:
    """Rows a line takes on the terminal, or None when the terminal might count differently.

    Terminals disagree on the width of emoji, combining marks and recent characters; such
    a line is trusted only when it surely fits on one row. Wide CJK characters that would
    straddle the edge wrap early, as terminals do.
    """
    rows, col, unsure = 1, 0, 0
    for c in line:
        w = _width(c)
        if w is None:
            unsure += 1
            continue
        if col + w > width:
            rows, col = rows + 1, 0
        col += w
    if unsure:
        return 1 if rows == 1 and col + 2 * unsure < width else None
    return rows


def _width(c: str) -> int | None:
    """1 or 2 where all terminals agree, else None."""
    o = ord(c)
    if 0x20 <= o < 0x7F or any(a <= o <= b for a, b in _NARROW):
        return 1
    if any(a <= o <= b for a, b in _WIDE):
        return 2
    return None


# Latin-1 (not the soft hyphen), Latin Extended, IPA, Greek, Cyrillic, punctuation, arrows, maths, boxes.
_NARROW = ((0xA0, 0xAC), (0xAE, 0x2FF), (0x370, 0x482), (0x2010, 0x2027), (0x2030, 0x205E), (0x2190, 0x22FF),
           (0x2400, 0x2426), (0x2500, 0x25FC), (0xFFFD, 0xFFFD))
_WIDE = ((0x1100, 0x115F), (0x2E80, 0x303E), (0x3041, 0x33FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xA4CF),
         (0xAC00, 0xD7A3), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFF60), (0xFFE0, 0xFFE6))
