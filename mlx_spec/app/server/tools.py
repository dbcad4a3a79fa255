"""Tool calls out of generated text, with the parser mlx-lm picks for the model family.

mlx-lm's tokenizer knows the family's markers (`<tool_call>`...`</tool_call>` for Qwen and
Hermes-style templates, `[TOOL_CALLS]` for Mistral, and others) and a parser for the text
between them. Text between markers is held back, then sent as structured calls.
"""

from __future__ import annotations

import json
import uuid


class ToolCallFilter:
    def __init__(self, start: str, end: str, parser, tools: list[dict]):
        self.start, self.end, self.parser, self.tools = start, end, parser, tools
        self.buf, self.in_call, self.count = "", False, 0

    @classmethod
    def for_request(cls, tokenizer, tools: list[dict] | None, tool_choice) -> "ToolCallFilter | None":
        if not tools or tool_choice == "none" or not getattr(tokenizer, "has_tool_calling", False):
            return None
        return cls(tokenizer.tool_call_start, tokenizer.tool_call_end or "", tokenizer.tool_parser, tools)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """New text in; (text safe to show, finished tool calls) out."""
        self.buf += text
        shown, calls = [], []
        while True:
            if self.in_call:
                j = self.buf.find(self.end) if self.end else -1
                if j < 0 and not final:
                    break
                body = self.buf if j < 0 else self.buf[:j]
                self.buf = "" if j < 0 else self.buf[j + len(self.end):]
                self.in_call = False
                parsed = self._parse(body)
                if parsed is None:  # not a call after all (or cut off): show it as text
                    shown.append(self.start + body + (self.end if j >= 0 else ""))
                calls += parsed or []
                continue
            i = self.buf.find(self.start)
            if i < 0:
                keep = 0 if final else _partial_suffix(self.buf, self.start)
                shown.append(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            shown.append(self.buf[:i])
            self.buf, self.in_call = self.buf[i + len(self.start):], True
        return "".join(shown), calls

    def _parse(self, body: str) -> list[dict] | None:
        try:
            parsed = self.parser(body, self.tools)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        parsed = parsed if isinstance(parsed, list) else [parsed]
        if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in parsed):
            return None
        return [self._format(c) for c in parsed]

    def _format(self, call: dict) -> dict:
        args = call.get("arguments", {})
        out = {"index": self.count, "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
               "function": {"name": call["name"],
                            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}
        self.count += 1
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could still grow into `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
