"""Test models for the agent APIs: chat templates that think and call tools, and scripted replies (no tests here).

They reuse factory.py's tiny target: only the tokenizer config changes, so the weights stay valid.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import test_server_harness as harness

# A Qwen3-style template: tools in a system turn, `<think>` reasoning, `<tool_call>` JSON, `enable_thinking`.
THINKING_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}{{- '<tool_call>\\n' }}"
    "{{- {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{{- '\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# As DeepSeek-R1 and Qwen3-Thinking: the template opens the thinking block, so the reply starts inside it.
OPEN_THINKING_TEMPLATE = THINKING_TEMPLATE.replace(
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}",
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}")


def with_template(src: Path, out: Path, template: str, tool_parser: str | None = "json_tools") -> Path:
    """A copy of the model at `src` whose tokenizer has `template` (and declares Hermes-style tool calls)."""
    if out.exists():
        return out
    shutil.copytree(src, out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    if tool_parser:
        cfg["tool_parser_type"] = tool_parser
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def play_back(monkeypatch, pieces: list[str]) -> None:
    """Every request replies with `pieces`, one per round."""
    harness.play_back(monkeypatch, harness.script(pieces))
