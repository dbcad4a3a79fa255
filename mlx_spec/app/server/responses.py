"""OpenAI response objects and stream chunks for chat and text completions.

Every final response and finish chunk also carries `speculative`: this request's drafted
and accepted tokens, τ (1 + accepted / rounds that drafted) and tokens per target pass.
"""

from __future__ import annotations

import time
import uuid

from .sequence import Output


def usage(out: Output) -> dict:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}


def speculative(out: Output) -> dict:
    stats = out.spec.as_dict() if out.spec is not None else {}
    return {**stats, "timed_out": out.timed_out}


class Format:
    """Shared shape of both endpoints; subclasses say how a choice carries text."""

    prefix = kind = chunk_kind = ""

    def __init__(self, model: str, include_usage: bool = False):
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created, self.model, self.include_usage = int(time.time()), model, include_usage

    def _envelope(self, obj: str, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def _chunk(self, fields: dict, finish: str | None = None, **extra) -> dict:
        if self.include_usage:
            extra.setdefault("usage", None)  # OpenAI: every chunk has usage, null but in the last one
        choice = {"index": 0, **fields, "logprobs": None, "finish_reason": finish}
        return self._envelope(self.chunk_kind, [choice], **extra)

    def role_chunk(self) -> dict | None:
        return None

    def content_chunk(self, text: str, calls: list[dict] | None = None) -> dict:
        return self._chunk(self._delta(text, calls))

    def content_chunks(self, reasoning: str, text: str, calls: list[dict]) -> list[dict]:
        """The chunks for one round's output: reasoning and text deltas, then each tool call.

        A call goes out as OpenAI streams one: a first delta with its index, id, type, name and
        empty arguments, then the arguments (parsed whole: a call is held back until complete).
        """
        chunks = []
        if reasoning:
            chunks.append(self._chunk({"delta": {"reasoning_content": reasoning}}))
        if text:
            chunks.append(self.content_chunk(text))
        for c in calls:
            head = {**c, "function": {"name": c["function"]["name"], "arguments": ""}}
            chunks.append(self.content_chunk("", [head]))
            if c["function"]["arguments"]:
                chunks.append(self.content_chunk("", [{"index": c["index"],
                                                       "function": {"arguments": c["function"]["arguments"]}}]))
        return chunks

    def finish_chunk(self, reason: str, out: Output) -> dict:
        return self._chunk(self._delta("", None), reason, speculative=speculative(out))

    def usage_chunk(self, out: Output) -> dict:
        return self._envelope(self.chunk_kind, [], usage=usage(out), speculative=speculative(out))

    def response(self, text: str, calls: list[dict], reason: str, out: Output, reasoning: str = "") -> dict:
        whole = self._whole(text, calls)
        if reasoning and "message" in whole:
            whole["message"]["reasoning_content"] = reasoning  # as vLLM and others return it
        choice = {"index": 0, **whole, "logprobs": None, "finish_reason": reason}
        return self._envelope(self.kind, [choice], usage=usage(out), speculative=speculative(out))

    def _delta(self, text: str, calls: list[dict] | None) -> dict:
        raise NotImplementedError

    def _whole(self, text: str, calls: list[dict]) -> dict:
        raise NotImplementedError


class ChatFormat(Format):
    prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def role_chunk(self) -> dict:
        return self._chunk({"delta": {"role": "assistant", "content": ""}})

    def _delta(self, text, calls) -> dict:
        delta = {"content": text} if text else {}
        if calls:
            delta["tool_calls"] = calls
        return {"delta": delta}

    def _whole(self, text, calls) -> dict:
        message = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        return {"message": message}


class CompletionFormat(Format):
    prefix, kind, chunk_kind = "cmpl", "text_completion", "text_completion"

    def _delta(self, text, calls) -> dict:
        return {"text": text}

    def _whole(self, text, calls) -> dict:
        return {"text": text}
