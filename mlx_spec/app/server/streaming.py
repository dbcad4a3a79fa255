"""Outputs to HTTP bodies: an SSE stream in OpenAI's order, or one JSON response.

Stream order: role delta, content deltas, finish chunk, usage chunk (if asked), [DONE].
':' comments keep the connection alive while nothing else is sent (queueing, long
prefills). A failure after the stream started is one `error` event, then the stream closes.
"""

from __future__ import annotations

import json
import logging
from typing import AsyncIterator

from .errors import APIError, error_body
from .handle import ClientGone, Handle
from .reasoning import Splitter
from .responses import Format
from .sequence import Output

log = logging.getLogger("mlx_spec.server")


def event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def named_event(name: str, obj: dict) -> str:
    """An SSE event with an `event:` line: the Anthropic and Responses clients dispatch on it."""
    return f"event: {name}\ndata: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def outputs(handle: Handle, keepalive: float) -> AsyncIterator[Output | None]:
    """The request's outputs, None whenever `keepalive` seconds pass without one; ends when the client goes."""
    while True:
        try:
            out = await handle.next(keepalive)
        except ClientGone:
            return
        yield out
        if out is not None and out.finish_reason is not None:
            return


async def sse(handle: Handle, fmt: Format, tools: Splitter | None, keepalive: float) -> AsyncIterator[str]:
    made_calls = False
    try:
        first = fmt.role_chunk()
        if first is not None:
            yield event(first)
        while True:
            try:
                out = await handle.next(keepalive)
            except ClientGone:
                return
            if out is None:
                yield ": keepalive\n\n"
                continue
            if out.error is not None or out.finish_reason == "abort":
                if out.error is not None:
                    yield event(_error(out.error))
                return
            thought, text, calls = _split(out, tools)
            made_calls |= bool(calls)
            for chunk in fmt.content_chunks(thought, text, calls):
                yield event(chunk)
            if out.finish_reason is not None:
                yield event(fmt.finish_chunk("tool_calls" if made_calls else out.finish_reason, out))
                if fmt.include_usage:
                    yield event(fmt.usage_chunk(out))
                yield "data: [DONE]\n\n"
                return
    finally:
        handle.close()


async def collect(handle: Handle, fmt: Format, tools: Splitter | None) -> dict | None:
    """The whole response, or None if the client left. Raises APIError for a failed generation."""
    got = await gather(handle, tools)
    if got is None:
        return None
    thought, text, calls, out = got
    return fmt.response(text, calls, "tool_calls" if calls else out.finish_reason, out, thought)


def raise_failure(out: Output) -> None:
    """A failed generation as the APIError a whole (not streamed) response answers with."""
    if out.error is not None:
        raise out.error if isinstance(out.error, APIError) else APIError(
            500, f"generation failed: {type(out.error).__name__}", code="internal_error")


def _split(out: Output, tools: Splitter | None) -> tuple[str, str, list[dict]]:
    if tools is None:
        return "", out.text, []
    return tools.feed(out.text, final=out.finish_reason is not None)


def failure(e: Exception) -> APIError:
    return e if isinstance(e, APIError) else APIError(500, f"generation failed: {type(e).__name__}",
                                                      code="internal_error")


def _error(e: Exception, path: str | None = None) -> dict:
    e = failure(e)
    return error_body(e.status, e.message, e.code, e.param, path=path)


async def gather(handle: Handle, splitter: Splitter | None) -> tuple[str, str, list[dict], Output] | None:
    """(reasoning, text, tool calls, last output) of a whole response; None if the client left."""
    thoughts, texts, calls = [], [], []
    try:
        async for out in outputs(handle, None):
            raise_failure(out)
            if out.finish_reason == "abort":
                return None
            thought, text, new = _split(out, splitter)
            thoughts.append(thought)
            texts.append(text)
            calls += new
            if out.finish_reason is not None:
                return "".join(thoughts), "".join(texts), calls, out
        return None
    finally:
        handle.close()
