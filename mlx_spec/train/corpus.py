"""The offline training corpus for the embedded target.

Three permissively licensed sources, all available without a model hub:
CPython's standard library source (PSF-2.0), the reST sources of the Python
documentation from Debian's ``python3.11-doc`` package (PSF-2.0), and the
``chitchat-dataset`` conversations from PyPI (MIT). Chats are rendered through
the chat template; stdlib functions with docstrings also become small
"write this function" chats so that the model learns to answer code requests.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

DEBIAN_DOCS = Path("/usr/share/doc/python3.11/html/_sources")
SKIP_STDLIB = ("test", "tests", "idlelib", "encodings", "site-packages", "lib2to3", "turtledemo", "__pycache__")

Render = Callable[[list[dict]], str]


@dataclass(frozen=True)
class CorpusConfig:
    stdlib: Path = Path(sysconfig.get_paths()["stdlib"])
    docs: Path = DEBIAN_DOCS
    max_code_chats: int = 12000
    max_chats: int = 3000  # chit-chat is plentiful; keep code and docs the majority
    # The long-context mix (0 = the shipped 512-token recipe): a whole source file, then a request
    # whose answer is in it, and several conversations joined into one long multi-turn chat.
    long_code_chats: int = 0
    long_chats: int = 0
    held_out_fraction: float = 0.02  # the source split's fraction (train-target --val-fraction), for long chats
    seed: int = 0


def stdlib_files(root: Path) -> list[Path]:
    files = [p for p in sorted(root.rglob("*.py")) if not set(p.relative_to(root).parts) & set(SKIP_STDLIB)]
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}")
    return files


def doc_files(root: Path) -> list[Path]:
    files = sorted(root.rglob("*.rst.txt")) or sorted(root.rglob("*.rst"))
    if not files:
        raise FileNotFoundError(
            f"no reST sources under {root}; get them with "
            "`apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb DIR` "
            "and pass --docs DIR/usr/share/doc/python3.11/html/_sources"
        )
    return files


def chitchat_chats() -> Iterator[list[dict]]:
    import chitchat_dataset

    for conv in chitchat_dataset.Dataset().values():
        turns = [" ".join(m["text"].strip() for m in turn) for turn in conv["messages"]]
        roles = ("user", "assistant")
        yield [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns) if t]


_CODE_ASKS = (
    "Write a Python function `{sig}` that {doc}",
    "How would you implement `{name}` in Python? It should {doc}",
    "Can you write `{sig}`? {Doc}",
    "Implement {name} in Python: {doc}",
    "Show me the source of `{module}.{qual}`.",
)
_CODE_INTROS = ("Here is an implementation:", "Sure:", "Here you go:", "", "This is how `{module}` does it:")


def code_chats(files: list[Path], root: Path, limit: int, rng: random.Random, with_path: bool = False) -> Iterator:
    """Functions with a docstring become a request and a fenced-code answer (with its file: `with_path`)."""
    found = []
    for path in files:
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        lines = source.splitlines()
        for node, qual in _functions(tree):
            doc = ast.get_docstring(node)
            length = node.end_lineno - node.lineno + 1
            if doc and 3 <= length <= 60 and not node.name.startswith("__"):
                body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
                found.append((path, module, qual, node, doc.strip().split("\n")[0], body))
    rng.shuffle(found)
    for path, module, qual, node, doc, body in found[:limit]:
        doc = doc.rstrip(".") + "."
        fields = dict(sig=f"{node.name}({ast.unparse(node.args)})", name=node.name, module=module, qual=qual,
                      doc=doc[0].lower() + doc[1:], Doc=doc)
        ask = rng.choice(_CODE_ASKS).format(**fields)
        intro = rng.choice(_CODE_INTROS).format(**fields)
        answer = (intro + "\n\n" if intro else "") + f"```python\n{body}\n```"
        chat = [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        yield (path, chat) if with_path else chat


_LONG_COPY = ("Write `{name}` from the code above again.", "Show me `{name}` from this file.",
              "Quote the definition of `{name}` above.")
_LONG_NEXT = ("Write the next function of this module.", "Continue this file with the next definition.",
              "What comes next in this file? Write it.")


def long_code_chats(files: list[Path], limit: int, rng: random.Random, max_chars: int = 5000) -> Iterator:
    """(file, chat): up to max_chars of a source file, then a request whose answer is a function that
    is in the excerpt (copy from context) or the one right after it (continue) — a long prompt."""
    found = []
    for path in files:
        source = path.read_text(encoding="utf-8", errors="replace")
        if len(source) < 2000:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        funcs = [n for n, _ in _functions(tree) if 3 <= n.end_lineno - n.lineno + 1 <= 60]
        if funcs:
            found.append((path, source.splitlines(), funcs))
    rng.shuffle(found)
    for j in range(limit if found else 0):  # several excerpts of a file when limit > files
        path, lines, funcs = found[j % len(found)]
        node = rng.choice(funcs)
        follow = rng.random() < 0.5
        end = node.lineno - 1 if follow else node.end_lineno  # the excerpt ends before / after the function
        start, size = end, 0
        while start > 0 and size + len(lines[start - 1]) + 1 <= max_chars:
            start, size = start - 1, size + len(lines[start - 1]) + 1
        if not follow and start >= node.lineno:
            continue  # the function alone is longer than the excerpt
        excerpt = "\n".join(lines[start:end])
        body = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
        ask = rng.choice(_LONG_NEXT if follow else _LONG_COPY).format(name=node.name)
        yield path, [{"role": "user", "content": f"```python\n{excerpt}\n```\n\n{ask}"},
                     {"role": "assistant", "content": f"```python\n{body}\n```"}]


def long_chats(chats: list[tuple[int, list[dict]]], limit: int, rng: random.Random,
               min_chars: int = 6000, max_chars: int = 8000) -> Iterator[tuple[str, list[dict]]]:
    """(key, chat): consecutive conversations joined into one long multi-turn chat (roles kept alternating)."""
    made, i = 0, 0
    while made < limit and i < len(chats):
        key, turns = f"chat:{chats[i][0]}", []
        while i < len(chats) and sum(len(t["content"]) for t in turns) < min_chars:
            conv = chats[i][1]
            i += 1
            conv = conv[: len(conv) - len(conv) % 2]  # whole user/assistant pairs
            if sum(len(t["content"]) for t in turns + conv) <= max_chars:
                turns += conv
        if len(turns) >= 4 and sum(len(t["content"]) for t in turns) >= min_chars:
            made += 1
            yield key, turns


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[ast.FunctionDef, str]]:
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, prefix + node.name
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def documents(config: CorpusConfig, render: Render) -> list[tuple[str, str]]:
    """All training documents as (source kind, text), in a seeded order."""
    return [(kind, text) for _, kind, text in keyed_documents(config, render)]


def keyed_documents(config: CorpusConfig, render: Render) -> list[tuple[str, str, str]]:
    """(source key, kind, text): the key names the file or conversation a document came from, so that
    a held-out split (`held_out`) keeps every document made from one source on the same side."""
    rng = random.Random(config.seed)
    root = config.stdlib
    py = stdlib_files(root)
    docs = [(_key(root, p), "code", p.read_text(encoding="utf-8", errors="replace")) for p in py]
    docs += [("doc:" + str(p.relative_to(config.docs)), "docs", p.read_text(encoding="utf-8", errors="replace"))
             for p in doc_files(config.docs)]
    chats = [(i, c) for i, c in enumerate(chitchat_chats()) if len(c) >= 2]
    rng.shuffle(chats)
    docs += [(f"chat:{i}", "chat", render(c)) for i, c in chats[: config.max_chats]]
    docs += [(_key(root, path), "code-chat", render(c))
             for path, c in code_chats(py, root, config.max_code_chats, rng, with_path=True)]
    if config.long_code_chats:
        docs += [(_key(root, path), "long-code-chat", render(c))
                 for path, c in long_code_chats(py, config.long_code_chats, rng)]
    if config.long_chats:
        # from conversations no short chat document uses, joined only with others on their side of the
        # split, keyed by the first one's "chat:" key: a held-out conversation never reaches training
        spare = chats[config.max_chats :]
        for held in (False, True):
            side = [c for c in spare if held_out(f"chat:{c[0]}", config.held_out_fraction) == held]
            limit = round(config.long_chats * config.held_out_fraction) + 1 if held else config.long_chats
            docs += [(key, "long-chat", render(c)) for key, c in long_chats(side, limit, rng)]
    rng.shuffle(docs)
    return docs


def _key(root: Path, path: Path) -> str:
    return "py:" + str(path.relative_to(root))


def held_out(key: str, fraction: float) -> bool:
    """A stable split by source: the same key is held out whatever the corpus around it."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) < fraction * 2**32


def describe(docs: list[tuple[str, str]]) -> str:
    counts: dict[str, list[int]] = {}
    for kind, text in docs:
        counts.setdefault(kind, [0, 0])
        counts[kind][0] += 1
        counts[kind][1] += len(text)
    return json.dumps({k: {"documents": n, "characters": c} for k, (n, c) in counts.items()})


def chat_questions(n: int, seed: int = 0, exclude: set[str] = frozenset()) -> list[dict]:
    """Single chat messages a person opens or asks with: the chit-chat conversations' substantive openers
    and their users' questions (20-150 characters), deduplicated and shuffled. The conversations' first
    turns alone repeat ("Hi", "Hello"), and a chat request is one message more often than a dialogue's end."""
    chats = list(chitchat_chats())
    texts = {m["content"] for c in chats for m in c if m["role"] == "user" and m["content"].endswith("?")}
    texts |= {c[0]["content"] for c in chats if c}
    texts = sorted(t for t in texts if 20 <= len(t) <= 150 and t not in exclude)
    random.Random(seed).shuffle(texts)
    return [{"kind": "chat", "messages": [{"role": "user", "content": t}]} for t in texts[:n]]


def drafter_prompts(config: CorpusConfig, n_code: int = 2000, n_chat: int = 1000) -> list[dict]:
    """Prompts for the embedded pair's drafter data: code requests and chat openers from the corpus."""
    rng = random.Random(config.seed + 1)
    py = stdlib_files(config.stdlib)
    code = [{"kind": "code", "messages": chat[:1]} for chat in code_chats(py, config.stdlib, n_code, rng)]
    chats = [c for c in chitchat_chats() if len(c) >= 2]
    rng.shuffle(chats)
    chat = [{"kind": "chat", "messages": c[:1]} for c in chats[:n_chat]]
    prompts = code + chat
    rng.shuffle(prompts)
    return prompts


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the embedded drafter's training prompts as JSONL.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--code", type=int, default=2000)
    parser.add_argument("--chat", type=int, default=1000)
    args = parser.parse_args()
    with args.out.open("w") as fh:
        for p in drafter_prompts(CorpusConfig(), args.code, args.chat):
            fh.write(json.dumps(p) + "\n")
