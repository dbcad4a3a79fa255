"""The trainers' settings (no MLX import: `train-target --help` and `train-drafter --help` read their defaults)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from .corpus import CorpusConfig

DRAFTER_LOSSES = ("ce", "auf", "kd")  # see DrafterTrainConfig.loss
DRAFTER_LABELS = ("data", "target")  # see DrafterTrainConfig.labels


@dataclass
class DrafterTrainConfig:
    out: Path = Path("runs/drafter")
    block_size: int = 8
    # shorter blocks the drafter also learns to draft from (each training block draws its size from these and
    # block_size): at run time a short draft runs only the rows it needs, and drafts as well as a short drafter
    sub_blocks: list[int] = field(default_factory=list)
    num_layers: int = 1
    target_layer_ids: list[int] | None = None
    steps: int = 2000
    sequences_per_step: int = 4
    anchors_per_sequence: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    # loss weight of slot k: exp(-(k-1)/gamma); None: the DFlash paper's for the block (train.drafter.decay_gamma)
    decay_gamma: float | None = None
    # "ce": every slot; "auf" (Accept-Until-Fail): each block only up to its first slot the drafter
    # gets wrong (slots after a miss are never verified, so their loss only adds noise); "kd": "ce" plus
    # the KL divergence from the target's next-token distribution at each slot
    loss: str = "ce"
    # "data": each slot learns the answer's next token; "target": the target's own greedy token there (its
    # argmax while the answer agrees with it): what verification checks, also on answers sampled at a temperature
    # (the log's slot_acc then counts the slots kept)
    labels: str = "data"
    sliding_window: int | None = None  # context rows a block sees (window - 1 before the anchor); None: all
    checkpoint_every: int = 100
    eval_every: int = 250
    seed: int = 0
    # what a resumed run must share with the checkpoint's (the step count and learning rate may change)
    same_run: ClassVar[tuple] = ("block_size", "sub_blocks", "num_layers", "target_layer_ids", "sequences_per_step",
                                 "anchors_per_sequence", "loss", "labels", "decay_gamma", "sliding_window", "seed")

    def __post_init__(self):
        if any(not 2 <= b < self.block_size for b in self.sub_blocks):
            raise ValueError(f"sub-blocks must be shorter than the block ({self.block_size}) and at least 2 (the "
                             f"anchor and one draft), got {self.sub_blocks}")

    @property
    def block_sizes(self) -> list[int]:
        """Every block size it trains at: the sub-blocks and the block."""
        return sorted({self.block_size, *self.sub_blocks})


@dataclass
class UnlikelihoodConfig:
    prompts: Path  # JSONL of training-side prompts (train.mix): never the evaluation's built-in set
    weight: float = 1.0  # of the unlikelihood term next to the corpus cross-entropy
    batch: int = 8  # answers per step
    tokens: int = 128  # greedy answer length
    n: int = 4  # a token in an n-gram seen earlier in the answer is a repeat
    max_prompt: int = 384  # longer prompts are left out (their answers cost, their loops are the same)


@dataclass
class TargetTrainConfig:
    out: Path = Path("runs/target")
    seed: int = 0
    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    max_position_embeddings: int = 2048
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 1100
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    eval_every: int = 100
    eval_batches: int = 16
    checkpoint_every: int = 50
    val_fraction: float = 0.01
    # "order": the first val_fraction of the shuffled documents (the shipped run); "source": a stable
    # split by source file or conversation (corpus.held_out), so every document made from a held-out
    # file stays out of training and the set does not move when the mix changes.
    split: str = "order"
    tokenizer_from: Path | None = None  # reuse this model's tokenizer (keeps a drafter's vocabulary)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    # a fine-tune against greedy loops (train/unlikelihood.py); None: cross-entropy alone
    unlikelihood: UnlikelihoodConfig | None = None
    # (the data is prepared once into out/data and reused on resume: its settings do not matter then)
    same_run: ClassVar[tuple] = ("seed", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                 "head_dim", "intermediate_size", "seq_len", "batch_size")

    def model_args(self, vocab_size: int):
        from mlx_lm.models import qwen3

        return qwen3.ModelArgs(
            model_type="qwen3", hidden_size=self.hidden_size, num_hidden_layers=self.num_layers,
            intermediate_size=self.intermediate_size, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=1e-6,
            vocab_size=vocab_size, max_position_embeddings=self.max_position_embeddings,
            rope_theta=10000.0, tie_word_embeddings=True,
        )


def steps(text: str) -> int:
    """An argparse type: a step count (0 or more)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"a step count must be an integer of 0 or more, got {text!r}")
    return n
