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


def code_chats(files: list[Path], root: Path, limit: int, rng: random.Random) -> Iterator[list[dict]]:
    """Functions with a docstring become a request and a fenced-code answer."""
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
                found.append((module, qual, node, doc.strip().split("\n")[0], body))
    rng.shuffle(found)
    for module, qual, node, doc, body in found[:limit]:
        doc = doc.rstrip(".") + "."
        fields = dict(sig=f"{node.name}({ast.unparse(node.args)})", name=node.name, module=module, qual=qual,
                      doc=doc[0].lower() + doc[1:], Doc=doc)
        ask = rng.choice(_CODE_ASKS).format(**fields)
        intro = rng.choice(_CODE_INTROS).format(**fields)
        answer = (intro + "\n\n" if intro else "") + f"```python\n{body}\n```"
        yield [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[ast.FunctionDef, str]]:
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, prefix + node.name
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")


def documents(config: CorpusConfig, render: Render) -> list[tuple[str, str]]:
    """All training documents as (source kind, text), in a seeded order."""
    rng = random.Random(config.seed)
    py = stdlib_files(config.stdlib)
    docs = [("code", p.read_text(encoding="utf-8", errors="replace")) for p in py]
    docs += [("docs", p.read_text(encoding="utf-8", errors="replace")) for p in doc_files(config.docs)]
    chats = [c for c in chitchat_chats() if len(c) >= 2]
    rng.shuffle(chats)
    docs += [("chat", render(c)) for c in chats[: config.max_chats]]
    docs += [("code-chat", render(c)) for c in code_chats(py, config.stdlib, config.max_code_chats, rng)]
    rng.shuffle(docs)
    return docs


def describe(docs: list[tuple[str, str]]) -> str:
    counts: dict[str, list[int]] = {}
    for kind, text in docs:
        counts.setdefault(kind, [0, 0])
        counts[kind][0] += 1
        counts[kind][1] += len(text)
    return json.dumps({k: {"documents": n, "characters": c} for k, (n, c) in counts.items()})


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
