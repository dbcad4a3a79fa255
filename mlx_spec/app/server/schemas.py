"""Request bodies of the OpenAI surface, with the fields real clients send.

Unknown fields are ignored (clients send many); known fields are bounded here so that
no value can wedge the engine. Limits that depend on the model or the server config
are checked in `params.py`.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class Base(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class TextPart(Base):
    type: Literal["text", "input_text"]
    text: str


class FunctionCall(Base):
    name: str
    arguments: str | dict = "{}"


class ToolCall(Base):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(Base):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Base):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(Base):
    type: Literal["function"]
    function: dict[str, Any]


class StreamOptions(Base):
    include_usage: bool | None = False


class ResponseFormat(Base):
    type: Literal["text", "json_object", "json_schema"]


class Sampling(Base):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model: str | None = None  # any name is accepted; the server has one model and never loads another
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # -1 and 0 both mean "off" (vLLM uses -1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, le=10)  # its floor is checked in params.py
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None  # with prompt_cache_key: keeps this client's prefix caches apart from others'
    prompt_cache_key: str | None = None


class ChatRequest(Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # vLLM's field: variables for the chat template. Only `enable_thinking` is passed on (see params.py).
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


class Extensions(Base):
    """mlx-spec's sampling fields beyond what the Messages and Responses APIs define (as in Chat Completions)."""

    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, le=10)
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 64)
    top_k: int | None = Field(None, ge=-1)
    user: str | None = None
    prompt_cache_key: str | None = None

    def sampling(self, **fields) -> Sampling:
        """These fields and the API's own as the `Sampling` that params.py turns into a job (already validated)."""
        mine = {k: getattr(self, k) for k in Extensions.model_fields}
        return Sampling.model_construct(**{**mine, **fields})
