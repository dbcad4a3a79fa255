"""Drafter training data from the target itself: its own answers to a set of prompts.

Answers are generated in batches with mlx-lm and appended to a JSONL file after each
batch, so an interrupted run resumes where it stopped. Hidden states are not stored;
the trainer recomputes them (cheap next to a stored [S, taps*H] array per sequence).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import MlxSpecError


@dataclass
class DataConfig:
    max_tokens: int = 256
    batch_size: int = 16
    temperature: float = 0.0  # greedy answers teach exactly what greedy decoding will verify
    seed: int = 0


def builtin_prompts() -> Path:
    return Path(str(resources.files("mlx_spec.train") / "prompts.jsonl"))


def read_prompts(path: Path) -> list[dict]:
    """JSONL of {"messages": [...]}, {"prompt": text} (a user message), {"text": text} (raw text,
    completed without the chat template) or plain strings; or a text file, one prompt a line.

    Each prompt keeps an optional "kind" (e.g. code, chat) for per-kind evaluation.
    """
    if not path.exists():
        raise MlxSpecError(f"prompt file {path} does not exist")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            prompts.append({"messages": [{"role": "user", "content": line}], "kind": "text"})
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise MlxSpecError(f"{path}:{n}: not JSON ({e.msg})") from None
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict) or not ({"messages", "prompt", "text"} & set(item)):
            raise MlxSpecError(f"{path}:{n}: expected 'messages', 'prompt' or 'text' (raw, no chat template)")
        if "text" in item and not isinstance(item["text"], str):
            raise MlxSpecError(f"{path}:{n}: 'text' must be a string")
        if "prompt" in item:
            item = {**item, "messages": [{"role": "user", "content": item.pop("prompt")}]}
        prompts.append(item)
    if not prompts:
        raise MlxSpecError(f"{path} has no prompts")
    return prompts


def encode(tokenizer, prompt: dict) -> list[int]:
    if "text" in prompt:  # a raw completion: encoded exactly as generation encodes a string prompt
        from ..generate import encode_prompt

        return list(encode_prompt(tokenizer, prompt["text"]))
    if tokenizer.has_chat_template:
        return list(tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=True))
    return tokenizer.encode("\n".join(m["content"] for m in prompt["messages"]))


def answer_batch(model, tokenizer, encoded: list[list[int]], max_tokens: int, temperature: float = 0.0,
                 keep_eos: bool = True) -> list[list[int]]:
    """The model's answers to encoded prompts, batched with mlx-lm, each cut at its first EOS (kept or not)."""
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_sampler

    eos = set(tokenizer.eos_token_ids)
    result = batch_generate(model, tokenizer, encoded, max_tokens=max_tokens, return_token_ids=True,
                            sampler=make_sampler(temperature))
    out = []
    for answer in result.token_ids:
        answer = list(answer)
        cut = next((j for j, t in enumerate(answer) if t in eos), None)
        out.append(answer if cut is None else answer[: cut + keep_eos])
    return out


def generate_data(model, tokenizer, prompts: list[dict], out: Path, cfg: DataConfig, progress=None) -> list[dict]:
    """Answer every prompt not yet in `out`; returns all records {id, kind, tokens, prompt_len}."""
    import mlx.core as mx

    records, torn = _read_records(out)
    if torn:
        out.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = {r["id"]: r for r in records}
    todo = [i for i in range(len(prompts)) if i not in done]
    mx.random.seed(cfg.seed)
    with out.open("a") as fh:
        for lo in range(0, len(todo), cfg.batch_size):
            ids = todo[lo : lo + cfg.batch_size]
            encoded = [encode(tokenizer, prompts[i]) for i in ids]
            answers = answer_batch(model, tokenizer, encoded, cfg.max_tokens, cfg.temperature)
            for i, p, answer in zip(ids, encoded, answers):
                record = {"id": i, "kind": prompts[i].get("kind", "text"), "tokens": p + answer, "prompt_len": len(p)}
                fh.write(json.dumps(record) + "\n")
                done[i] = record
            fh.flush()
            if progress:
                progress(len(done), len(prompts))
    return [done[i] for i in sorted(done)]


def _read_records(path: Path) -> tuple[list[dict], bool]:
    """Complete records, and whether a torn tail (an interrupted write) was dropped."""
    if not path.exists():
        return [], False
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            return records, True
    return records, False
