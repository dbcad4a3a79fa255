"""Tiny checkpoints with native MTP heads, in the layouts the model makers publish (Hugging Face).

- Qwen3.5: the hybrid target from `archs`, written back in Hugging Face's layout (names under
  `model.language_model`, conv1d [C, 1, K], zero-centred norms) plus `mtp.*` tensors;
  `text_config.mtp_num_hidden_layers` 1.
- DeepSeek-V3: `model.layers.{N}` past the N decoder layers (enorm, hnorm, eh_proj, shared_head,
  embed_tokens, a MoE block with per-expert tensors and a combined kv_b_proj); `num_nextn_predict_layers` 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

import archs
import factory

NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
         ".k_norm.weight")  # the norms Hugging Face's Qwen3.5 stores zero-centred (scale = weight + 1)


def _write(out: Path, weights: dict, config: dict, tokenizer_dir: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_dir.glob("*token*"):
        shutil.copy(f, out / f.name)
    return out


def _normal(shape, scale):
    return mx.random.normal(shape) * scale


def qwen35(out: Path, tokenizer_dir: Path, seed: int = 0, mtp_seed: int = 5, layers: int = 4) -> Path:
    """A Qwen3.5 hybrid target with an MTP head, as Hugging Face publishes it."""
    if (out / "config.json").exists():
        return out
    from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

    base = archs.make(out.with_name(out.name + "-mlx"), tokenizer_dir, "qwen3_5", layers=layers, seed=seed)
    config = json.loads((base / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    weights = {}
    for k, v in mx.load(str(base / "model.safetensors")).items():
        if "conv1d.weight" in k:
            v = v.moveaxis(1, 2)  # mlx [C, K, 1] -> Hugging Face [C, 1, K]
        if k.endswith(NORMS) and v.ndim == 1:
            v = v - 1.0
        weights[k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head", "lm_head")] = v
    tc = config["text_config"]
    args = TextModelArgs.from_dict(tc)
    mx.random.seed(mtp_seed)
    layer = DecoderLayer(args, args.full_attention_interval - 1)
    h = args.hidden_size
    for k, v in tree_flatten(layer.parameters()):
        weights[f"mtp.layers.0.{k}"] = v - 1.0 if k.endswith(NORMS) else v * 4.0 if v.ndim == 2 else v
    weights["mtp.fc.weight"] = _normal((h, 2 * h), 4.0 / (2 * h) ** 0.5)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        weights[f"mtp.{name}.weight"] = _normal((h,), 0.1)  # zero-centred: scales near 1
    return _write(out, weights, config, tokenizer_dir)


DEEPSEEK = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=64, intermediate_size=128,
                moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                n_routed_experts=4, routed_scaling_factor=1.0, kv_lora_rank=24, q_lora_rank=None, qk_rope_head_dim=8,
                v_head_dim=8, qk_nope_head_dim=16, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
                n_group=1, topk_group=1, num_experts_per_tok=2, moe_layer_freq=1, first_k_dense_replace=1,
                max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                attention_bias=False, tie_word_embeddings=False, num_nextn_predict_layers=1, eos_token_id=2)


def _hf_block(params: dict, args) -> dict:
    """A mlx-lm DeepSeek-V3 layer's tensors as Hugging Face names them (per-expert, kv_b_proj)."""
    out = {}
    for k, v in params.items():
        if ".switch_mlp." in k:
            for e in range(v.shape[0]):
                out[k.replace(".switch_mlp.", f".experts.{e}.")] = v[e]
        elif k.endswith("embed_q.weight"):
            kv_b = mx.concatenate([v.swapaxes(-1, -2), params[k.replace("embed_q", "unembed_out")]], axis=1)
            out[k.replace("embed_q", "kv_b_proj")] = kv_b.reshape(-1, args.kv_lora_rank)
        elif not k.endswith("unembed_out.weight"):
            out[k] = v
    return out


def deepseek(out: Path, tokenizer_dir: Path, layers: int = 3, seed: int = 0, mtp_seed: int = 5) -> Path:
    """A DeepSeek-V3 target with its MTP module at model.layers.{layers}, in Hugging Face's layout."""
    if (out / "config.json").exists():
        return out
    from mlx_lm.models import deepseek_v3

    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = {**DEEPSEEK, "num_hidden_layers": layers, "vocab_size": vocab}
    args = deepseek_v3.ModelArgs.from_dict(config)
    mx.random.seed(seed)
    model = deepseek_v3.Model(args)
    scaled = lambda p: {k: v * 4.0 if v.ndim >= 2 else v for k, v in tree_flatten(p)}
    weights = {}
    for i, layer in enumerate(model.model.layers):
        weights.update({f"model.layers.{i}.{k}": v for k, v in _hf_block(scaled(layer.parameters()), args).items()})
    weights.update({k: v for k, v in scaled(model.parameters()).items() if ".layers." not in k})
    mx.random.seed(mtp_seed)
    n, h = layers, args.hidden_size
    block = _hf_block(scaled(deepseek_v3.DeepseekV3DecoderLayer(args, n).parameters()), args)
    weights.update({f"model.layers.{n}.{k}": v for k, v in block.items()})
    weights[f"model.layers.{n}.eh_proj.weight"] = _normal((h, 2 * h), 4.0 / (2 * h) ** 0.5)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"model.layers.{n}.{name}.weight"] = 1.0 + _normal((h,), 0.1)
    weights[f"model.layers.{n}.shared_head.head.weight"] = weights["lm_head.weight"]  # copies, as published
    weights[f"model.layers.{n}.embed_tokens.weight"] = weights["model.embed_tokens.weight"]
    return _write(out, weights, config, tokenizer_dir)


__all__ = ["qwen35", "deepseek", "factory"]
