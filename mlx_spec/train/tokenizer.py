"""Byte-level BPE tokenizer for the embedded target, saved in Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from jinja2.sandbox import ImmutableSandboxedEnvironment

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, MASK]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_template = ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    return _template.render(messages=messages, add_generation_prompt=add_generation_prompt)


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    """Write tokenizer.json and a tokenizer_config.json that transformers and mlx-lm read."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                  "normalized": False, "single_word": False}
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END, MASK],
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START, IM_END, MASK]},
                   indent=2) + "\n"
    )
