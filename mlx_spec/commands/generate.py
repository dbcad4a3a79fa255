"""`mlx-spec generate`: stream a completion and end with a one-line summary."""

from __future__ import annotations

import sys

from ..options import add_model_arguments, add_sampling_arguments, load_from, sampling_from


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_sampling_arguments(p)
    p.add_argument("--prompt", "-p", default="Write a Python function that reverses a string.",
                   help="the prompt ('-' reads standard input)")
    p.add_argument("--system", default=None, help="system message for the chat template")
    p.add_argument("--raw", action="store_true", help="complete the prompt as plain text, without the chat template")
    from ..distributed.cli import add_distributed_arguments

    add_distributed_arguments(p)


def run(args) -> int:
    from ..generate import stream_generate

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.distributed:
        from ..distributed.cli import run_generate

        return run_generate(args, prompt, chat_prompt)
    model, tokenizer = load_from(args)
    prompt = chat_prompt(args, tokenizer, prompt)
    last = None
    for last in stream_generate(model, tokenizer, prompt, args.max_tokens, sampling=sampling_from(args),
                                stop=args.stop, block_size=args.block_size):
        print(last.text, end="", flush=True)
    print()
    print(summary(last, model.drafter is not None), file=sys.stderr)
    return 0


def chat_prompt(args, tokenizer, prompt):
    """The prompt as chat messages, unless --raw or the tokenizer has no chat template."""
    if args.raw or not tokenizer.has_chat_template:
        return prompt
    return ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": prompt}]


def summary(r, speculative: bool) -> str:
    line = (f"prompt: {r.prompt_tokens} tokens, {r.prompt_tps:.1f} tok/s | "
            f"generation: {r.generation_tokens} tokens, {r.generation_tps:.1f} tok/s")
    if speculative and r.spec is not None and r.spec.rounds:
        s = r.spec
        line += (f" | τ {s.tau:.2f} ({s.accepted}/{s.drafted} drafts accepted in {s.drafting_rounds} drafting rounds"
                 f" of {s.rounds}; {s.tokens_per_pass:.2f} tokens per target pass)")
    return line + f" | peak memory {r.peak_memory:.3f} GB"
