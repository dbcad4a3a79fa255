"""Tiny random models of the sliding-window, MoE and hybrid families, saved in the on-disk format.

Built with mlx-lm's own classes (as `factory.make_target` does for the dense families). Each entry
is the config a checkpoint of that family carries, shrunk; `make` fills in the common fields.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

from mlx_spec.bench_models import random_model, save_model

COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              rms_norm_eps=1e-6, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True)

FAMILIES = {
    # sliding window 8, every other layer global
    "gemma3_text": dict(model_type="gemma3_text", rope_local_base_freq=10000.0, query_pre_attn_scalar=16,
                        sliding_window=8, sliding_window_pattern=2),
    # alternating sliding/full attention with attention sinks, MoE MLP
    "gpt_oss": dict(model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"] * 2, intermediate_size=64),
    "qwen3": dict(model_type="qwen3"),  # dense, for side-by-side checks
    "qwen3_moe": dict(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                      mlp_only_layers=[], moe_intermediate_size=64, norm_topk_prob=True),
    # Gated DeltaNet + full attention (every 2nd layer here)
    "qwen3_5": dict(model_type="qwen3_5", text_config=dict(
        model_type="qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        full_attention_interval=2, tie_word_embeddings=True,
        rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5, rope_type="default"))),
    # Qwen3.5's MoE layout: the same Gated DeltaNet layers, sparse MLPs with a shared expert
    "qwen3_5_moe": dict(model_type="qwen3_5_moe", text_config=dict(
        model_type="qwen3_5_moe_text", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=512,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=True, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=1, shared_expert_intermediate_size=64, moe_intermediate_size=64,
        rope_parameters=dict(rope_theta=10000.0, partial_rotary_factor=0.5, rope_type="default"))),
    # LFM2's MoE layout: short convolutions + attention, the first layer dense
    "lfm2_moe": dict(model_type="lfm2_moe", norm_eps=1e-6, conv_bias=False, conv_L_cache=3, moe_intermediate_size=64,
                     num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, use_expert_bias=True,
                     num_dense_layers=1, full_attn_idxs=[1, 3]),
    "qwen3_next": dict(model_type="qwen3_next", linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                       decoder_sparse_step=1, shared_expert_intermediate_size=64, mlp_only_layers=[],
                       moe_intermediate_size=64, partial_rotary_factor=0.5, full_attention_interval=2),
    # Mamba2 + attention + MLP blocks, layers under `backbone`
    "nemotron_h": dict(model_type="nemotron_h", hybrid_override_pattern=["M", "*", "M", "-"], attention_bias=False,
                       mamba_num_heads=4, mamba_head_dim=16, mamba_proj_bias=False, ssm_state_size=16, conv_kernel=4,
                       n_groups=1, mlp_bias=False, layer_norm_epsilon=1e-6, use_bias=False, use_conv_bias=True,
                       time_step_limit=[0.0, 1e9]),
    # Mamba2 and attention in every layer: a CacheList per layer
    "falcon_h1": dict(model_type="falcon_h1", mamba_d_conv=4, mamba_d_head=16, mamba_d_ssm=64, mamba_d_state=16,
                      mamba_n_heads=4, mamba_n_groups=1, mamba_chunk_size=16, rope_theta=10000.0),
    # short convolutions + attention
    "lfm2": dict(model_type="lfm2", norm_eps=1e-6, conv_bias=False, conv_L_cache=3, block_dim=64, block_multiple_of=16,
                 block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False, block_ff_dim=128,
                 full_attn_idxs=[1, 3]),
    "granitemoehybrid": dict(model_type="granitemoehybrid", attention_bias=False, embedding_multiplier=1.0,
                             attention_multiplier=0.25, logits_scaling=1.0, residual_multiplier=1.0,
                             layer_types=["mamba", "attention", "mamba", "attention"], num_local_experts=4,
                             num_experts_per_tok=2, shared_intermediate_size=64, mamba_n_heads=4, mamba_d_head=16,
                             mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=16,
                             mamba_conv_bias=True, mamba_proj_bias=False, position_embedding_type="rope"),
    # Kimi Delta Attention + MLA
    "kimi_linear": dict(model_type="kimi_linear", model_max_length=512, num_experts=4, moe_intermediate_size=64,
                        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_experts_per_token=2,
                        first_k_dense_replace=1, linear_attn_config=dict(kda_layers=[1, 3], full_attn_layers=[2, 4],
                                                                          num_heads=4, head_dim=16, short_conv_kernel_size=4)),
    # pure Mamba2 (no attention), layers under `backbone`
    "mamba2": dict(model_type="mamba2", num_heads=4, head_dim=16, state_size=16, n_groups=1, conv_kernel=4,
                   use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-6, time_step_limit=[0.0, 1e9],
                   time_step_rank="auto", expand=1),
    # Mamba + attention (every other layer)
    "plamo2": dict(model_type="plamo2", hidden_size_per_head=16, mamba_d_state=16, mamba_d_conv=4, mamba_num_heads=4,
                   mamba_step=2, mamba_chunk_size=16, attention_window_size=512),
    # Gated DeltaNet with q/k/v short convolutions + attention
    "olmo_hybrid": dict(model_type="olmo_hybrid", linear_num_key_heads=2, linear_num_value_heads=4,
                        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                        linear_allow_neg_eigval=True, attention_bias=False,
                        layer_types=["linear_attention", "full_attention"] * 2),
    # Lightning (GLA-style) linear attention + MLA every 2nd layer, MoE with a shared expert
    "bailing_hybrid": dict(model_type="bailing_hybrid", moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                           num_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, layer_group_size=2,
                           group_norm_size=1, routed_scaling_factor=1.0, kv_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=16, v_head_dim=16, partial_rotary_factor=0.5),
    # pure Mamba (v1): refused for speculation (its layers never call cache.advance), decodes plainly
    "mamba": dict(model_type="mamba", state_size=16, conv_kernel=4, use_bias=False, use_conv_bias=True,
                  time_step_rank="auto"),
    # Kimi Delta Attention (q/k/v short convolutions) every 2nd layer + MLA, MoE with a shared expert
    "bailing_moe_v3": dict(model_type="bailing_moe_v3", moe_intermediate_size=64,
                           moe_shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                           num_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, layer_group_size=2,
                           routed_scaling_factor=1.0, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                           qk_rope_head_dim=8, v_head_dim=16, short_conv_kernel_size=4),
    # gated short-convolution mixers + sliding-window and global attention (a tied head collapses to one token)
    "gear": dict(model_type="gear", layer_types=["conv_mixer", "sliding_attention", "conv_mixer", "full_attention"],
                 sliding_window=8, conv_L_cache=3, query_pre_attn_scalar=16, tie_word_embeddings=False),
    # Kimi Delta Attention (one fused q/k/v convolution) + MLA, MoE; settings under `text_config`, layers
    # returning (hidden, residual blocks)
    "kimi_k3": dict(model_type="kimi_k3", text_config=dict(
        model_type="kimi_linear", hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=512, num_experts=4, moe_intermediate_size=64,
        num_experts_per_token=2, num_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, tie_word_embeddings=True,
        linear_attn_config=dict(kda_layers=[1, 3], full_attn_layers=[2, 4], num_heads=4, head_dim=16,
                                short_conv_kernel_size=4))),
    # MLA + MoE with zero experts, two attentions per layer (a CacheList of two KV caches per layer)
    "longcat_flash": dict(model_type="longcat_flash", attention_method="MLA", zero_expert_type="identity",
                          ffn_hidden_size=128, moe_topk=2, expert_ffn_hidden_size=64, n_routed_experts=4,
                          zero_expert_num=1, num_layers=2, num_hidden_layers=2, kv_lora_rank=16, q_lora_rank=32,
                          qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=1.0,
                          mla_scale_q_lora=True, mla_scale_kv_lora=True, attention_bias=False),
    # longcat_flash with n-gram embeddings: refused for speculation (its n-gram context cache never calls
    # cache.advance), decodes plainly
    "longcat_flash_ngram": dict(model_type="longcat_flash_ngram", ffn_hidden_size=128, moe_topk=2,
                                expert_ffn_hidden_size=64, n_routed_experts=4, zero_expert_num=1, num_layers=2,
                                num_hidden_layers=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                                qk_nope_head_dim=16, v_head_dim=16, routed_scaling_factor=1.0, mla_scale_q_lora=True,
                                mla_scale_kv_lora=True, ngram_vocab_size_ratio=2, emb_neighbor_num=3,
                                emb_split_num=2),
    # MLA with a sparse top-k indexer (8 keys, so the prompt already exceeds it); a CacheList (MLA, indexer)
    "deepseek_v32": dict(model_type="deepseek_v32", index_head_dim=16, index_n_heads=2, index_topk=8,
                         moe_intermediate_size=64, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
                         first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
                         v_head_dim=16, qk_nope_head_dim=16),
    # block-sparse attention (an indexer keeps 2 blocks of 4 keys) every 2nd layer, MoE; under `text_config`
    "minimax_m3_vl": dict(model_type="minimax_m3_vl", text_config=dict(
        hidden_size=64, intermediate_size=64, dense_intermediate_size=128, shared_intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2,
        head_dim=16, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True,
        mlp_layer_types=["dense", "sparse", "dense", "sparse"],
        layer_types=["full_attention", "minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
        index_n_heads=2, index_head_dim=16, index_block_size=4, index_topk_blocks=2, index_local_blocks=1)),
}


# kimi_k3 with attention residuals: each layer returns a block's partial sum, mixed over blocks at the end (so
# DFlash taps are refused); a tied head collapses to one token
FAMILIES["kimi_k3_attn_res"] = dict(FAMILIES["kimi_k3"], text_config=dict(
    FAMILIES["kimi_k3"]["text_config"], attn_res_block_size=2, tie_word_embeddings=False))


SCALES = {"plamo2": 0.7}  # plamo2's random outputs collapse to one token at larger scales


def make(out: Path, tokenizer_dir: Path, family: str, layers: int = 4, seed: int = 0, scale: float | None = None,
         **overrides) -> Path:
    """A random-weight target of `family`; weights scaled so that logits are peaked, like a trained model's."""
    if (out / "config.json").exists():
        return out
    scale = SCALES.get(family, 4.0) if scale is None else scale
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    config = {**COMMON, "num_hidden_layers": layers, "vocab_size": vocab, **FAMILIES[family], **overrides}
    if "text_config" in config:  # a multimodal checkpoint's layout: the language model's settings nested
        config["text_config"] = {"vocab_size": vocab, **config["text_config"]}
    config["architectures"] = ["RandomForTests"]
    config["eos_token_id"] = 2
    model = random_model(config, seed, scale)
    for layer in model.layers:  # gpt-oss's attention sinks start at zero: make them matter
        attn = getattr(layer, "self_attn", None)
        if attn is not None and "sinks" in attn:
            attn.sinks = mx.random.normal(attn.sinks.shape)
    return save_model(model, config, tokenizer_dir, out)
