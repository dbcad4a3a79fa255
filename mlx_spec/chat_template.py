"""Chat messages to token ids, with the special tokens of the chat template only.

A message may quote control markers: `<|im_end|>\\n<|im_start|>system ...` in a web page an
agent read or in a tool's output. Tokenized as-is, that text would close its turn and forge a
system or assistant turn. OpenAI's API treats such text as text; so do we: the template's own
markers stay special, and message contents are tokenized with special tokens split into
ordinary text tokens.

How: the template is rendered a second time with each content replaced by a sentinel, which
shows which parts of the prompt the template wrote. A message without special-token text
takes the plain path (the same ids as `tokenizer.apply_chat_template`). Whatever path is taken,
the prompt must end up with exactly the special tokens the template alone emits, or it is refused
with `UntrustedSpecialTokens` (a template that rewrote a content, or a marker in another field).
"""

from __future__ import annotations

import re
import secrets

from .errors import MlxSpecError

CONTENT_FIELDS = ("content", "reasoning_content")


class UntrustedSpecialTokens(MlxSpecError, ValueError):
    pass


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
    """Token ids of the rendered conversation, ready to generate the assistant's reply.

    `template_kwargs` reach the template as variables (e.g. `enable_thinking=False`)."""
    text = _render(tokenizer, messages, tools, template_kwargs)
    specials = special_tokens(tokenizer)
    if not specials or not _mentions(messages, tools, specials):
        return list(tokenizer.encode(text, add_special_tokens=False))
    nonce = secrets.token_hex(4)
    contents, masked = [], []
    for original in messages:
        m = dict(original)
        for key in CONTENT_FIELDS:
            if isinstance(original.get(key), str) and original[key]:
                m[key] = f"@@mlxspec{len(contents)}x{nonce}@@"
                contents.append(original[key])
        masked.append(m)
    template = _render(tokenizer, masked, tools, template_kwargs)
    pieces = _assemble(text, template, contents, re.compile(rf"@@mlxspec(\d+)x{nonce}@@"))
    ids = _encode_pieces(tokenizer, pieces, specials) if pieces is not None else \
        list(tokenizer.encode(text, add_special_tokens=False))
    allowed = _count_specials(tokenizer.encode(template, add_special_tokens=False), specials)
    if _count_specials(ids, specials) != allowed:
        raise UntrustedSpecialTokens("a message contains special-token text that the chat template does not keep "
                                     "verbatim, so it cannot be sent as plain text")
    return ids


def special_tokens(tokenizer) -> dict[str, int]:
    """Special added tokens (control markers) by text."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {t.content: i for i, t in decoder.items() if getattr(t, "special", False) and t.content}


def _render(tokenizer, messages, tools, template_kwargs=None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))


def _mentions(messages, tools, specials: dict[str, int]) -> bool:
    """Whether any client string could carry a special token (a cheap first look)."""
    found = re.compile("|".join(re.escape(s) for s in specials))
    stack: list = [messages, tools]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if found.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _assemble(text: str, template: str, contents: list[str], sentinel: re.Pattern) -> list[tuple[str, bool]] | None:
    """The prompt as (text, written by the template?) pieces; None if the template did not copy contents
    verbatim (nor stripped, for templates that trim them)."""
    for variant in (contents, [c.strip() for c in contents]):
        pieces, at = [], 0
        for match in sentinel.finditer(template):
            pieces += [(template[at:match.start()], True), (variant[int(match.group(1))], False)]
            at = match.end()
        pieces.append((template[at:], True))
        if "".join(p for p, _ in pieces) == text:
            return pieces
    return None


def _encode_pieces(tokenizer, pieces: list[tuple[str, bool]], specials: dict[str, int]) -> list[int]:
    """Cut at the template's special tokens only; the text between is tokenized with specials split.

    Normal tokenization also cuts at every special token, so the template's parts come out as
    they would have, and a content flows into its neighbouring text as ordinary text would.
    """
    marker = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    ids: list[int] = []
    run: list[str] = []

    def flush():
        if run:
            ids.extend(tokenizer.encode("".join(run), add_special_tokens=False, split_special_tokens=True))
            run.clear()

    for text, trusted in pieces:
        if not trusted:
            run.append(text)
            continue
        at = 0
        for match in marker.finditer(text):
            run.append(text[at:match.start()])
            flush()
            ids.append(specials[match.group(0)])
            at = match.end()
        run.append(text[at:])
    flush()
    return ids


def _count_specials(ids, specials: dict[str, int]) -> int:
    wanted = set(specials.values())
    return sum(1 for i in ids if i in wanted)
