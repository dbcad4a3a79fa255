"""Request bodies to validated request models, in the threadpool, with the checks JSON itself does not make.

Parsing and validating a multi-megabyte body takes long enough to stall the event loop (and
with it every keep-alive, stream and /health probe), so `decode` runs off the loop. Before
validation, one iterative walk over the parsed JSON refuses what would fail later as a 5xx:

- nesting deeper than `MAX_DEPTH`: pydantic, the chat template's `tojson` and `json.dumps`
  all recurse, and Python's recursion limit ends them in a RecursionError;
- strings with lone or reversed UTF-16 surrogates (`"\\ud800"` is valid JSON): no UTF-8
  tokenizer can encode them.

The same walk counts the characters under each top-level field, so that a prompt too long for
the context is refused without being tokenized (see `params.check_prompt_chars`).
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ValidationError

from .errors import APIError, invalid

BYTES_PER_CHAR = 12  # the most JSON text one character can take: a surrogate pair as two \\uXXXX escapes
ROOM_FOR_THE_REST = 1 << 20  # stop strings, logit_bias, formatting: everything a body holds besides the prompt
MAX_DEPTH = 64  # JSON schemas of real tools nest a dozen levels; nothing legitimate nests 64
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins valid pairs, so any left is lone


def check_length(raw: bytes, max_prompt_chars: int | None) -> None:
    """413 for a body longer than any request whose prompt fits the context: refused without parsing."""
    if max_prompt_chars is None:
        return
    limit = max_prompt_chars * BYTES_PER_CHAR + ROOM_FOR_THE_REST
    if len(raw) > limit:
        raise APIError(413, f"the request body is {len(raw)} bytes; no request whose prompt fits this model's "
                       f"context is longer than {limit} bytes", code="request_too_large")


def decode(raw: bytes, model: type[BaseModel]) -> tuple[BaseModel, dict[str, int]]:
    """The validated request and the string characters under each top-level field; APIError 400 otherwise."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise invalid("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    chars = {key: check_tree(value, key) for key, value in data.items()}
    try:
        return model.model_validate(data), chars
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or None
        raise invalid(f"{loc or 'body'}: {first['msg']}", loc) from None


def check_tree(value, param: str | None = None) -> int:
    """Refuse deep nesting and lone surrogates anywhere in `value`; return its total string characters."""
    chars, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and _SURROGATE.search(node):  # isascii: a fast pass for most text
                raise invalid("strings must be valid Unicode (a lone UTF-16 surrogate is not)", param)
            chars += len(node)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            raise invalid(f"the request nests deeper than {MAX_DEPTH} levels", param)
        if isinstance(node, dict):
            stack.extend((k, depth) for k in node)
            stack.extend((v, depth + 1) for v in node.values())
        else:
            stack.extend((v, depth + 1) for v in node)
    return chars


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
