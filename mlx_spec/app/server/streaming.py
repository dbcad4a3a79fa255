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
from .responses import Format
from .sequence import Output
from .tools import ToolCallFilter

log = logging.getLogger("mlx_spec.server")


def event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def sse(handle: Handle, fmt: Format, tools: ToolCallFilter | None, keepalive: float) -> AsyncIterator[str]:
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
            text, calls = _split(out, tools)
            made_calls |= bool(calls)
            if text or calls:
                yield event(fmt.content_chunk(text, calls))
            if out.finish_reason is not None:
                yield event(fmt.finish_chunk("tool_calls" if made_calls else out.finish_reason, out))
                if fmt.include_usage:
                    yield event(fmt.usage_chunk(out))
                yield "data: [DONE]\n\n"
                return
    finally:
        handle.close()


async def collect(handle: Handle, fmt: Format, tools: ToolCallFilter | None) -> dict | None:
    """The whole response, or None if the client left. Raises APIError for a failed generation."""
    texts, calls = [], []
    try:
        while True:
            try:
                out = await handle.next()
            except ClientGone:
                return None
            if out.error is not None:
                raise out.error if isinstance(out.error, APIError) else APIError(
                    500, f"generation failed: {type(out.error).__name__}", code="internal_error")
            if out.finish_reason == "abort":
                return None
            text, new_calls = _split(out, tools)
            texts.append(text)
            calls += new_calls
            if out.finish_reason is not None:
                return fmt.response("".join(texts), calls, "tool_calls" if calls else out.finish_reason, out)
    finally:
        handle.close()


def _split(out: Output, tools: ToolCallFilter | None) -> tuple[str, list[dict]]:
    if tools is None:
        return out.text, []
    return tools.feed(out.text, final=out.finish_reason is not None)


def _error(e: Exception) -> dict:
    if isinstance(e, APIError):
        return error_body(e.status, e.message, e.code, e.param)
    return error_body(500, f"generation failed: {type(e).__name__}", "internal_error")
