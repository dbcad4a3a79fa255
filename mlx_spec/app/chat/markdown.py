"""Markdown styling one line at a time, so a reply can be styled while it streams.

Fenced code is highlighted with the block so far as context (multi-line strings stay right);
other lines get heading, list, quote and inline styles. Tables and HTML stay as written.
"""

from __future__ import annotations

import re

from rich.syntax import Syntax
from rich.text import Text

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
BULLET = re.compile(r"^(\s*)[-*+]\s+(?=\S)")
QUOTE = re.compile(r"^ {0,3}>\s?")
RULE = re.compile(r"^ {0,3}([-*_])(\s*\1){2,}\s*$")
INLINE = re.compile(
    r"(?P<code>`+)(?P<code_text>.+?)(?P=code)"
    r"|\*\*(?P<bold>[^*\s](?:.*?[^*\s])?)\*\*"
    r"|__(?P<bold2>[^_\s](?:.*?[^_\s])?)__"
    r"|(?<![*\w])\*(?P<em>[^*\s](?:[^*]*?[^*\s])?)\*(?![*\w])"
    r"|(?<![_\w])_(?P<em2>[^_\s](?:[^_]*?[^_\s])?)_(?![_\w])"
    r"|~~(?P<strike>.+?)~~"
    r"|\[(?P<link>[^\]]+)\]\((?P<url>[^)\s]+)\)"
)
STYLES = {"code": "bold cyan", "bold": "bold", "bold2": "bold", "em": "italic", "em2": "italic", "strike": "strike"}


class MarkdownLines:
    def __init__(self, theme: str = "ansi_dark", width: int = 80):
        self.theme, self.width = theme, width
        self.fence: str | None = None  # the open fence's marker, while inside a code block
        self.lang = ""
        self.code: list[str] = []

    def feed(self, line: str) -> Text:
        """The styled form of the next complete line (without its newline)."""
        m = FENCE.match(line)
        if self.fence is None and m:
            self.fence, self.lang, self.code = m.group(1), m.group(2), []
            return Text(line, style="dim")
        if self.fence is not None:
            if m and m.group(1)[0] == self.fence[0] and len(m.group(1)) >= len(self.fence) and not m.group(2):
                self.fence = None
                return Text(line, style="dim")
            self.code.append(line)
            return self._code_line()
        return self._prose(line)

    def _code_line(self) -> Text:
        if not self.lang:
            return Text(self.code[-1], style="cyan")
        # Highlight the block so far and keep its last line: the lexer needs the context.
        window = self.code[-200:]
        text = Syntax("", self.lang, theme=self.theme).highlight("\n".join(window))
        lines = text.split("\n", allow_blank=True)
        return lines[len(window) - 1] if len(lines) >= len(window) else Text(window[-1])

    def _prose(self, line: str) -> Text:
        if RULE.match(line):
            return Text("─" * min(self.width, 60), style="dim")
        m = HEADING.match(line)
        if m:
            level = len(m.group(1))
            return inline(m.group(2), "bold underline" if level <= 2 else "bold")
        m = QUOTE.match(line)
        if m:
            return Text("▌ ", style="dim") + inline(line[m.end():], "italic")
        m = BULLET.match(line)
        if m:
            return Text(m.group(1) + "• ") + inline(line[m.end():])
        return inline(line)


def inline(s: str, style: str = "") -> Text:
    """Code spans, bold, italics, strike-through and links, with their markers removed."""
    out = Text(style=style)
    pos = 0
    for m in INLINE.finditer(s):
        out.append(s[pos:m.start()])
        kind = next(k for k, v in m.groupdict().items() if v is not None and k not in ("code", "url"))
        if kind == "link":
            out.append(m.group("link"), style="underline")
            out.append(f" ({m.group('url')})", style="dim")
        else:
            out.append(m.group(kind), style=STYLES["code" if kind == "code_text" else kind])
        pos = m.end()
    out.append(s[pos:])
    return out
