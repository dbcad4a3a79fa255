"""Command-line options shared by every entry point that loads a model and samples from it
(`generate`, `bench`, `doctor`, `eval-drafter`, `chat`, `serve`)."""

from __future__ import annotations

import argparse

from .drafters import MODES


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="target: local folder or Hugging Face repo id (default: embedded model)")
    p.add_argument("--drafter", default="auto", help="drafter folder or repo id; 'auto' picks the known one")
    p.add_argument("--mode", default="auto", choices=MODES,
                   help="how to draft: auto reads the drafter's kind from its checkpoint and drafts with prompt "
                        "lookup beside it where a conversation favours that; with none, the target's own MTP "
                        "head if it has one, else prompt lookup; a named mode runs its drafter alone")
    p.add_argument("--no-draft", action="store_true", help="plain decoding, no speculation (same as --mode off)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per verify round (anchor + drafts)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--no-kernels", action="store_true", help="never use the custom Metal kernels")
    p.add_argument("--kv-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8),
                   help="keep full-attention keys/values quantized to this many bits (less memory for long contexts)")
    p.add_argument("--kv-group-size", type=int, default=64, choices=(32, 64, 128), help="group size of --kv-bits")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_from(args):
    from .engine.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.seed,
    )


def load_from(args):
    from .loading import load

    return load(args.model, drafter=None if args.no_draft else args.drafter, mode=args.mode, dtype=args.dtype,
                kernels=not args.no_kernels, block_size=args.block_size, kv_bits=args.kv_bits,
                kv_group_size=args.kv_group_size)
