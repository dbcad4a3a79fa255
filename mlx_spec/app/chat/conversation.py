"""The messages of one conversation, and their JSON file format for /save and /load."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "mlx-spec-chat/1"
ROLES = ("system", "user", "assistant")


@dataclass
class Conversation:
    system: str | None = None
    turns: list[dict] = field(default_factory=list)  # user and assistant messages, in order

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def add(self, role: str, content: str) -> None:
        self.turns.append({"role": role, "content": content})

    def last(self, role: str) -> dict | None:
        return self.turns[-1] if self.turns and self.turns[-1]["role"] == role else None

    def pop(self) -> dict:
        return self.turns.pop()

    def clear(self) -> None:
        self.turns.clear()

    def to_json(self, **meta) -> dict:
        return {"format": FORMAT, **meta, "messages": self.messages()}

    @classmethod
    def from_json(cls, data) -> "Conversation":
        """Accepts what /save writes, or a bare OpenAI-style list of messages; ValueError says what is wrong."""
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list):
            raise ValueError("expected a JSON object with a 'messages' list")
        conv = cls()
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
                raise ValueError(f"message {i + 1} needs a role ({', '.join(ROLES)}) and a text content")
            if m["role"] == "system":
                conv.system = m["content"]
            else:
                conv.add(m["role"], m["content"])
        return conv

    def save(self, path: Path, **meta) -> None:
        path.write_text(json.dumps(self.to_json(**meta), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "Conversation":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON ({e.msg}, line {e.lineno})") from None
        except UnicodeDecodeError:
            raise ValueError("not a text file") from None
        return cls.from_json(data)
