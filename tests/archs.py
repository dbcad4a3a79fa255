"""Tiny random models of the sliding-window, MoE and hybrid families, saved in the on-disk format.

Built with mlx-lm's own classes (as `factory.make_target` does for the dense families). Each entry
is the config a checkpoint of that family carries, shrunk; `make` fills in the common fields.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map

import factory

COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              rms_norm_eps=1e-6, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True)

FAMILIES = {
    # sliding window 8, every other layer global
    "gemma3_text": dict(model_type="gemma3_text", rope_local_base_freq=10000.0, query_pre_attn_scalar=16,
                        sliding_window=8, sliding_window_pattern=2),
    # alternating sliding/full attention with attention sinks, MoE MLP
    "gpt_oss": dict(model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"] * 2, intermediate_size=64),
}


def make(out: Path, tokenizer_dir: Path, family: str, layers: int = 4, seed: int = 0, scale: float = 4.0,
         **overrides) -> Path:
    """A random-weight target of `family`; weights scaled so that logits are peaked, like a trained model's."""
    from mlx_lm.utils import _get_classes

    if (out / "config.json").exists():
        return out
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = {**COMMON, "num_hidden_layers": layers, "vocab_size": vocab, **FAMILIES[family], **overrides}
    config["architectures"] = ["RandomForTests"]
    config["eos_token_id"] = 2
    mx.random.seed(seed)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    for layer in model.layers:  # gpt-oss's attention sinks start at zero: make them matter
        attn = getattr(layer, "self_attn", None)
        if attn is not None and "sinks" in attn:
            attn.sinks = mx.random.normal(attn.sinks.shape)
    return factory._save(model, config, tokenizer_dir, out)
