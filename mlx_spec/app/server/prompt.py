"""Request prompts to token ids: chat messages through the model's chat template, or raw completions.

Chat templates run in transformers' ImmutableSandboxedEnvironment (no attribute escapes,
no file or code access), so a template shipped with a model cannot reach the host.
"""

from __future__ import annotations

import json
import threading

import jinja2

from mlx_spec.chat_template import UntrustedSpecialTokens, encode_chat
from mlx_spec.generate import encode_prompt

from .backend import ModelInfo
from .body import check_tree
from .errors import invalid
from .reasoning import ReasoningFilter, Splitter, markers_for, opens_thinking
from .schemas import Message

PROMPT_TAIL_TOKENS = 16  # enough to see whether the prompt ends with an open thinking block


class PromptBuilder:
    """Tokenizes on the HTTP side, one call at a time (HF tokenizers are not safe to re-enter)."""

    def __init__(self, tokenizer, info: ModelInfo):
        self.tokenizer, self.info = tokenizer, info
        self._lock = threading.Lock()
        self.thinking = markers_for(tokenizer)  # None: the template does not think

    def splitter(self, ids: list[int], tools) -> Splitter | None:
        """What separates this reply's reasoning and tool calls from its text (None: nothing to separate)."""
        reasoning = None
        if self.thinking is not None:
            with self._lock:
                tail = self.tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:])
            reasoning = ReasoningFilter(self.thinking, inside=opens_thinking(tail, self.thinking))
        return Splitter(reasoning, tools) if reasoning is not None or tools is not None else None

    def chat(self, messages: list[Message], tools: list[dict] | None, template_kwargs: dict | None = None) -> list[int]:
        if not messages:
            raise invalid("messages must not be empty", "messages")
        if not getattr(self.tokenizer, "has_chat_template", False):
            raise invalid("this model has no chat template; use /v1/completions", "messages")
        chat = [_plain(m) for m in messages]
        with self._lock:
            try:
                # contents cannot forge control tokens
                return encode_chat(self.tokenizer, chat, tools, **(template_kwargs or {}))
            except jinja2.TemplateError as e:  # includes the sandbox's SecurityError and raise_exception()
                raise invalid(f"the chat template rejected these messages: {e}", "messages") from None
            except UntrustedSpecialTokens as e:
                raise invalid(str(e), "messages", code="special_tokens_in_content") from None
            except RecursionError:
                raise invalid("the messages nest too deeply for the chat template", "messages") from None
            except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
                raise invalid(f"cannot render the chat template: {type(e).__name__}: {e}", "messages") from None

    def completion(self, prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise invalid("only one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, list):
            bad = next((t for t in prompt if not 0 <= t < self.info.vocab_size), None)
            if bad is not None:
                raise invalid(f"token id {bad} is outside the vocabulary [0, {self.info.vocab_size})", "prompt")
            return list(prompt)
        with self._lock:
            return encode_prompt(self.tokenizer, prompt)


def _plain(m: Message) -> dict:
    """The dict a chat template expects: string content, arguments as objects, 'developer' as 'system'."""
    out = {"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": _args(c.function.arguments)}}
                             for c in m.tool_calls]
    return out


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


def _args(arguments):
    # Templates render arguments with `| tojson`; a JSON string would come out double-encoded.
    # A string that is not JSON is passed as it is; one that nests too deeply is refused (body.py).
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
        check_tree(parsed, "messages")
        return parsed
    return arguments
