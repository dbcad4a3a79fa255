"""Reasoning out of generated text: `<think>...</think>` returned apart from the answer.

Reasoning models write their thinking between markers; clients want it separated (Chat
Completions' `reasoning_content`, Messages' `thinking` blocks, Responses' reasoning items), not
leaked into the answer. Only models whose chat template thinks get a filter, so a model that
merely mentions `<think>` in an answer keeps its text as it is.

Where thinking starts: some templates open the block themselves (the prompt ends in `<think>`,
as DeepSeek-R1's and Qwen3-Thinking's do), so the output starts inside it; otherwise a block
counts only at the very start of the output (after whitespace). Thinking ends at the end marker;
the whitespace right after it is dropped from the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tools import _partial_suffix


@dataclass(frozen=True)
class Markers:
    start: str = "<think>"
    end: str = "</think>"


def markers_for(tokenizer) -> Markers | None:
    """The model's thinking markers, or None when its chat template does not think."""
    if getattr(tokenizer, "has_thinking", False) and tokenizer.think_start and tokenizer.think_end:
        found = Markers(tokenizer.think_start, tokenizer.think_end)
    else:
        found = Markers()
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or found.start not in template:
        return None
    return found


def opens_thinking(prompt_tail: str, markers: Markers) -> bool:
    """Whether the prompt ends inside a thinking block (the template opened it)."""
    return prompt_tail.rfind(markers.start) > prompt_tail.rfind(markers.end)


class ReasoningFilter:
    """Streamed text in; (reasoning, answer) pieces out, holding back what could be half a marker."""

    def __init__(self, markers: Markers, inside: bool = False):
        self.m = markers
        self.state = "thinking" if inside else "start"  # start -> thinking -> after -> answer
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning = answer = ""
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(self.m.start):
                    self.buf, self.state = head[len(self.m.start):], "thinking"
                    continue
                if not final and (not head or self.m.start.startswith(head)):
                    break  # could still become the opening marker
                self.state = "answer"
                continue
            if self.state == "thinking":
                j = self.buf.find(self.m.end)
                if j >= 0:
                    reasoning += self.buf[:j]
                    self.buf, self.state = self.buf[j + len(self.m.end):], "after"
                    continue
                keep = 0 if final else _partial_suffix(self.buf, self.m.end)
                reasoning += self.buf[: len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                break
            if self.state == "after":  # the blank line between thinking and answer is not the answer
                self.buf = self.buf.lstrip()
                if not self.buf and not final:
                    break
                self.state = "answer"
                continue
            answer, self.buf = answer + self.buf, ""
            break
        return reasoning, answer


class Splitter:
    """Reasoning first, then tool calls out of the answer: calls inside thinking are not calls."""

    def __init__(self, reasoning: ReasoningFilter | None, tools):
        self.reasoning, self.tools = reasoning, tools

    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[dict]]:
        """(reasoning, answer text, finished tool calls) for the new text."""
        thought, answer = self.reasoning.feed(text, final) if self.reasoning is not None else ("", text)
        if self.tools is None:
            return thought, answer, []
        shown, calls = self.tools.feed(answer, final)
        return thought, shown, calls
