"""`mlx-spec train-target`: the reproducible recipe behind the embedded target model."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from ..train.corpus import DEBIAN_DOCS
    from ..train.config import TargetTrainConfig, steps

    d = TargetTrainConfig()
    p.add_argument("--out", type=Path, default=d.out, help="run folder: data, checkpoint, log, exported model")
    p.add_argument("--docs", type=Path, default=DEBIAN_DOCS, help="reST sources of the Python docs (python3.11-doc)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--layers", type=int, default=d.num_layers)
    p.add_argument("--hidden", type=int, default=d.hidden_size)
    p.add_argument("--split", choices=("order", "source"), default=d.split,
                   help="held-out documents: first of the shuffled order (shipped run) or by source file")
    p.add_argument("--val-fraction", type=float, default=d.val_fraction)
    p.add_argument("--tokenizer-from", type=Path, default=None, help="reuse this model folder's tokenizer")
    p.add_argument("--long-code-chats", type=int, default=0, help="long-context mix: source excerpt + request chats")
    p.add_argument("--long-chats", type=int, default=0, help="long-context mix: joined multi-turn chats")
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--until", type=steps, default=None,
                   help="stop after this many steps, short of --steps (checkpointed, nothing exported; 0: the data only); "
                        "rerun without it to go on")
    p.add_argument("--init-from", type=Path, default=None, help="start from an exported model's weights, or a run's checkpoint folder")
    p.add_argument("--quantize-8bit", type=Path, default=None, help="also write an 8-bit copy here")
    p.add_argument("--unlikelihood", type=Path, default=None, metavar="PROMPTS",
                   help="fine-tune against greedy loops: each step the model answers a few of these prompts "
                        "(JSONL, training side) and repeated 4-grams in its answers are penalised")
    p.add_argument("--ul-weight", type=float, default=1.0, help="weight of the unlikelihood term")
    p.add_argument("--ul-batch", type=int, default=8, help="answers per step")
    p.add_argument("--ul-tokens", type=int, default=128, help="greedy answer length")


def run(args) -> int:
    from ..train.config import UnlikelihoodConfig
    from ..train.corpus import CorpusConfig
    from ..train.target import TargetTrainConfig, quantize_copy, train

    unlikelihood = None
    if args.unlikelihood is not None:
        from ..errors import MlxSpecError

        if not args.unlikelihood.exists():  # (before the corpus is built: minutes)
            raise MlxSpecError(f"--unlikelihood {args.unlikelihood}: no such prompt file")
        unlikelihood = UnlikelihoodConfig(prompts=args.unlikelihood, weight=args.ul_weight, batch=args.ul_batch,
                                          tokens=args.ul_tokens)
    cfg = TargetTrainConfig(
        out=args.out, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        seed=args.seed, num_layers=args.layers, hidden_size=args.hidden, split=args.split,
        val_fraction=args.val_fraction, tokenizer_from=args.tokenizer_from, warmup=args.warmup,
        checkpoint_every=args.checkpoint_every, unlikelihood=unlikelihood,
        corpus=CorpusConfig(docs=args.docs, seed=args.seed, long_code_chats=args.long_code_chats,
                            long_chats=args.long_chats, held_out_fraction=args.val_fraction),
    )
    exported = train(cfg, init_from=args.init_from, until=args.until)
    if exported is None:
        from ..train.checkpoint import stopped

        print(stopped(args.out / "checkpoint"))
        return 0
    print(f"model written to {exported}")
    if args.quantize_8bit:
        print(f"8-bit copy written to {quantize_copy(exported, args.quantize_8bit, bits=8)}")
    return 0
