"""Prompt sets for the embedded pair beyond short chats: raw continuations and long contexts.

The drafter only ever saw chat answers, so raw completions (no chat template) and 1–2k-token
prompts collapsed its acceptance. These sets come from the same offline corpus, split by source
(`corpus.held_out`, the target's held-out files): training prompts from the rest, evaluation
prompts from the held-out side only, so τ on them is measured on code neither model trained on.

A prompt is {"kind", "messages"} (chat template applied) or {"kind", "text"} (raw text, encoded as
`generate` encodes a string prompt).
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

from . import corpus

HELD_OUT_FRACTION = 0.02  # the fraction train-target --split source --val-fraction 0.02 holds out


def _side(root: Path, files: list[Path], held: bool, fraction: float) -> list[Path]:
    return [p for p in files if corpus.held_out(corpus._key(root, p), fraction) == held]


def raw_code_prompts(config: corpus.CorpusConfig, n: int, held: bool, fraction: float = HELD_OUT_FRACTION,
                     max_chars: int = 1500, seed: int = 0, newline: bool = False) -> list[dict]:
    """Raw continuations: up to max_chars of a source file ending with a `def` line, no chat template.

    The prompt stops at the line's last character: the tokenizer merges a newline with the next line's
    indentation, so a prompt ending in a bare newline reads as the end of a block (the target closed a
    code fence there and stopped, for four prompts in five). `newline` keeps it, as the sets made before
    session 22 did (the recipes of the weights trained on them)."""
    rng = random.Random(seed)
    root = config.stdlib
    cuts = []
    for path in _side(root, corpus.stdlib_files(root), held, fraction):
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines()
        cuts += [(path, lines, node.lineno) for node, _ in corpus._functions(tree) if node.lineno > 3]
    rng.shuffle(cuts)
    out = []
    for path, lines, end in cuts[:n]:
        start, size = end, 0
        while start > 0 and size + len(lines[start - 1]) + 1 <= max_chars:
            start, size = start - 1, size + len(lines[start - 1]) + 1
        out.append({"kind": "raw-code", "text": "\n".join(lines[start:end]) + ("\n" if newline else "")})
    return out


def long_prompts(config: corpus.CorpusConfig, n: int, held: bool, fraction: float = HELD_OUT_FRACTION,
                 seed: int = 0) -> list[dict]:
    """Long prompts, half a source excerpt plus a request, half a long multi-turn chat (last turn the user's)."""
    rng = random.Random(seed)
    root = config.stdlib
    files = _side(root, corpus.stdlib_files(root), held, fraction)
    code = [{"kind": "long", "messages": chat[:1]} for _, chat in corpus.long_code_chats(files, n - n // 2, rng)]
    chats = [(i, c) for i, c in enumerate(corpus.chitchat_chats()) if len(c) >= 2]
    chats = [(i, c) for i, c in chats if corpus.held_out(f"chat:{i}", fraction) == held]
    # chat runs ~2.8 characters a token: 3,500-5,500 characters is about 1,300-2,000 tokens
    talk = [{"kind": "long", "messages": c[:-1]}
            for _, c in corpus.long_chats(chats, n // 2, rng, min_chars=3500, max_chars=5500)]
    return code + talk


def answered(prompts: list[dict], records: list[dict], tokenizer, kind: str = "code") -> list[tuple[list[dict], str]]:
    """(request, the target's answer) for each chat prompt of `kind`: `records` is train-drafter's data.jsonl
    for `prompts` (its ids are their line numbers; a record whose prompt is not that line's is refused)."""
    from .data import encode

    eos, out = set(tokenizer.eos_token_ids), []
    for r in sorted(records, key=lambda r: r["id"]):
        if not 0 <= r["id"] < len(prompts) or r["tokens"][: r["prompt_len"]] != encode(tokenizer, prompts[r["id"]]):
            raise ValueError(f"answer {r['id']} is not to line {r['id'] + 1} of the mix: --answers must be the "
                             "data.jsonl that train-drafter wrote for the --after mix")
        if r["kind"] == kind and "messages" in prompts[r["id"]]:
            answer = [t for t in r["tokens"][r["prompt_len"] :] if t not in eos]  # the chat template ends the turn
            out.append((prompts[r["id"]]["messages"], tokenizer.decode(answer)))
    return out


def long_talks(pairs: list[tuple[list[dict], str]], tokenizer, n: int, lo: int = 1000, hi: int = 1900,
               seed: int = 32, kind: str = "long") -> list[dict]:
    """n long multi-turn chats: earlier turns are requests answered in the target's own words (`pairs`), then one
    more request; each grows to a length drawn from [lo, hi] tokens (kept if it ends inside). A user's long session
    with the model, where the bench's long chat repeats made-up turns and a long prompt pastes a file."""
    from .data import encode

    if len(pairs) < 2:
        raise ValueError("long chats need at least two answered requests")
    rng, out, tries = random.Random(seed), [], 50 * n
    while len(out) < n and tries:
        tries -= 1
        goal = rng.randint(lo, hi)
        picks = rng.sample(pairs, min(30, len(pairs)))
        ask, turns = picks.pop()[0], []
        for request, answer in picks:
            turn = request + [{"role": "assistant", "content": answer}]
            if len(encode(tokenizer, {"messages": turns + turn + ask})) > goal:
                break
            turns += turn
        chat = {"kind": kind, "messages": turns + ask}
        if lo <= len(encode(tokenizer, chat)) <= hi:
            out.append(chat)
    if len(out) < n:
        raise ValueError(f"made {len(out)} of {n} chats of {lo}-{hi} tokens: the answered requests are too few or short")
    return out


def eval_talks(model, tokenizer, n: int = 20) -> list[dict]:
    """Held-out long chats (1,000-2,000 tokens): the built-in evaluation prompts, which no drafter trains on,
    answered by the target (up to 128 tokens) and chained as `long_talks` chains the training side's."""
    from .data import builtin_prompts, read_prompts
    from .target_eval import answers

    prompts = read_prompts(builtin_prompts())
    pairs = [(p["messages"], tokenizer.decode(a)) for p, a in zip(prompts, answers(model, tokenizer, prompts, 128))]
    return long_talks(pairs, tokenizer, n, lo=1000, hi=2000, seed=2, kind="long-talk")


def drafter_mix(config: corpus.CorpusConfig, n_code: int, n_chat: int, n_raw: int, n_long: int,
                fraction: float = HELD_OUT_FRACTION, raw_newline: bool = False) -> list[dict]:
    """Training prompts for the drafter: chat-formatted code and chat (corpus.drafter_prompts), raw
    continuations and long prompts from the training side of the split, shuffled."""
    prompts = corpus.drafter_prompts(config, n_code, n_chat)
    prompts += raw_code_prompts(config, n_raw, held=False, fraction=fraction, seed=config.seed + 2, newline=raw_newline)
    prompts += long_prompts(config, n_long, held=False, fraction=fraction, seed=config.seed + 3)
    random.Random(config.seed + 4).shuffle(prompts)
    return prompts


def subset(prompts: list[dict], counts: dict[str, int], seed: int = 0) -> list[dict]:
    """The first counts[kind] prompts of each kind, in the order of `counts`, then shuffled: a smaller mix
    drawn from a bigger one (runs/drafter-mix-1000.jsonl from runs/drafter-mix-prompts.jsonl)."""
    out = [p for kind, n in counts.items() for p in [p for p in prompts if p.get("kind") == kind][:n]]
    random.Random(seed).shuffle(out)
    return out


def after(done: list[dict], pool: list[dict], counts: dict[str, int]) -> list[dict]:
    """`done`, then up to counts[kind] prompts of each kind from `pool` that `done` lacks (in the pool's
    order), shortest first by characters: a bigger mix whose first rows keep their ids, so answers already
    generated for `done` are reused (train-drafter resumes its data.jsonl by id)."""
    seen, left, new = {json.dumps(p, sort_keys=True) for p in done}, dict(counts), []
    for p in pool:
        if json.dumps(p, sort_keys=True) not in seen and left.get(p.get("kind"), 0) > 0:
            new.append(p)
            left[p["kind"]] -= 1
    return done + sorted(new, key=lambda p: len(json.dumps(p)))


def within(prompts: list[dict], tokenizer, lo: int, hi: int) -> list[dict]:
    """Prompts whose encoded length (as the generation loop encodes them) lies in [lo, hi]."""
    from .data import encode

    return [p for p in prompts if lo <= len(encode(tokenizer, p)) <= hi]


def by_length(prompts: list[dict], tokenizer) -> list[dict]:
    """Shortest encoded first (ties keep their order): the target answers them in batches of alike lengths."""
    from .data import encode

    return sorted(prompts, key=lambda p: len(encode(tokenizer, p)))


def _load(model: str | None):
    from ..loading import load

    return load(model, drafter=None)


def _tokenizer(model: str | None):
    return _load(model)[1]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(path: Path, prompts: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the drafter's mixed training prompts, or the held-out "
                                                 "evaluation sets (raw code continuations, long prompts).")
    parser.add_argument("out", type=Path, help="a JSONL file (training mix) or a folder (--eval)")
    parser.add_argument("--eval", action="store_true",
                        help="write held-out raw-code.jsonl, long.jsonl and long-chat.jsonl (the target's answers)")
    parser.add_argument("--docs", type=Path, default=corpus.DEBIAN_DOCS)
    parser.add_argument("--code", type=int, default=2000)
    parser.add_argument("--chat", type=int, default=1000)
    parser.add_argument("--raw", type=int, default=1000)
    parser.add_argument("--long", type=int, default=600)
    parser.add_argument("--raw-newline", action="store_true",
                        help="end each raw prompt with a newline (the sets made before session 22)")
    parser.add_argument("--model", default=None, help="target whose tokenizer bounds the long prompts")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="take the first --code/--chat/--raw/--long prompts of each kind from this mix, shuffled")
    parser.add_argument("--after", type=Path, default=None,
                        help="with --from: this mix first, then up to --code/--chat/--raw/--long prompts of the "
                             "source that it lacks (its answers are reused)")
    parser.add_argument("--chat-questions", type=int, default=None, metavar="N",
                        help="write N single chat messages (chit-chat openers and questions; none of the built-in "
                             "evaluation prompts): a pool for --from")
    parser.add_argument("--by-length", action="store_true",
                        help="with --from: order by encoded length (answered in batches of alike lengths)")
    parser.add_argument("--long-talks", type=int, default=None, metavar="N",
                        help="with --after and --answers: that mix, then N long multi-turn chats (1,000-1,900 tokens) "
                             "whose earlier turns are its code requests with the target's answers")
    parser.add_argument("--answers", type=Path, default=None,
                        help="with --long-talks: train-drafter's data.jsonl for the --after mix")
    args = parser.parse_args()
    cfg = corpus.CorpusConfig(docs=args.docs)
    if args.chat_questions is not None:
        from .data import builtin_prompts, read_prompts

        held = {m["content"] for p in read_prompts(builtin_prompts()) for m in p.get("messages", [])}
        write(args.out, corpus.chat_questions(args.chat_questions, seed=cfg.seed + 5, exclude=held))
    elif args.long_talks is not None:
        if args.after is None or args.answers is None:
            parser.error("--long-talks needs --after (a mix) and --answers (its data.jsonl)")
        done, tok = read(args.after), _tokenizer(args.model)
        talks = long_talks(answered(done, read(args.answers), tok), tok, args.long_talks)
        write(args.out, done + sorted(talks, key=lambda p: len(json.dumps(p))))
    elif args.source is not None:
        rows = read(args.source)
        counts = {"code": args.code, "chat": args.chat, "raw-code": args.raw, "long": args.long}
        if args.after is not None:
            write(args.out, after(read(args.after), rows, counts))
        else:
            rows = subset(rows, counts)
            write(args.out, by_length(rows, _tokenizer(args.model)) if args.by_length else rows)
    elif args.eval:
        loaded, tok = _load(args.model)
        write(args.out / "raw-code.jsonl", raw_code_prompts(cfg, 40, held=True, newline=args.raw_newline))
        bounded = within(long_prompts(cfg, 200, held=True), tok, 1000, 2000)
        code, talk = [p for p in bounded if len(p["messages"]) == 1], [p for p in bounded if len(p["messages"]) > 1]
        write(args.out / "long.jsonl", code[:15] + talk[:15])  # a source file + request; a long multi-turn chat
        write(args.out / "long-chat.jsonl", eval_talks(loaded.model, tok))  # a long session with the target itself
    else:
        write(args.out, drafter_mix(cfg, args.code, args.chat, args.raw, args.long, raw_newline=args.raw_newline))
