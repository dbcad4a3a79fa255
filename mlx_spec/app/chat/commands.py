"""Slash commands: the table (names, usage, help) and a parser from a typed line to a checked Command.

The parser knows nothing about the model; every mistake it finds becomes a one-line CommandError.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .settings import SETTABLE

BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}
NONE_WORDS = ("none", "default", "auto")


@dataclass(frozen=True)
class Spec:
    name: str
    usage: str
    help: str
    aliases: tuple[str, ...] = ()
    args: str = "none"  # how the rest of the line is read: none | command | text | toggle | set | path


SPECS = (
    Spec("help", "/help [COMMAND]", "list the commands, or explain one", ("?",), "command"),
    Spec("bye", "/bye", "leave (also Ctrl-D)", ("exit", "quit")),
    Spec("clear", "/clear", "start a new conversation (the system message stays)"),
    Spec("regen", "/regen", "drop the last reply and generate it again"),
    Spec("system", "/system [TEXT|off]", "show, set or remove the system message", args="text"),
    Spec("set", "/set [KEY [VALUE]]", "show the settings, or change one: " + ", ".join(SETTABLE), args="set"),
    Spec("draft", "/draft [on|off]", "speculative decoding on, or off to compare with plain decoding", args="toggle"),
    Spec("stats", "/stats", "acceptance per draft position and the cost model behind the speedup"),
    Spec("save", "/save FILE", "save the conversation as JSON", args="path"),
    Spec("load", "/load FILE", "replace the conversation with one saved by /save", args="path"),
    Spec("model", "/model", "show the loaded target, drafter and decoding mode"),
)
BY_NAME = {n: s for s in SPECS for n in (s.name, *s.aliases)}


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple = ()


class CommandError(ValueError):
    """What to type instead, in one line."""


def is_command(line: str) -> bool:
    """A line starting with '/' is a command; '//' sends a message that starts with '/'."""
    return line.startswith("/") and not line.startswith("//")


def parse(line: str) -> Command:
    head, _, rest = re.sub(r"\s", " ", line.strip(), count=1)[1:].partition(" ")
    spec = BY_NAME.get(head.lower())
    if spec is None:
        raise CommandError(f"unknown command /{head}{_suggest(head.lower(), BY_NAME, '/')}; /? lists the commands")
    return Command(spec.name, _READERS[spec.args](spec, rest.strip()))


def _none(spec: Spec, rest: str) -> tuple:
    if rest:
        raise CommandError(f"/{spec.name} takes no arguments")
    return ()


def _command(spec: Spec, rest: str) -> tuple:
    if not rest:
        return ()
    name = rest.lstrip("/").lower()
    if name not in BY_NAME:
        raise CommandError(f"no command /{name}{_suggest(name, BY_NAME, '/')}; /? lists the commands")
    return (BY_NAME[name].name,)


def _text(spec: Spec, rest: str) -> tuple:
    """() shows the system message, (None,) removes it, (text,) sets it."""
    if not rest:
        return ()
    text = unquote(rest)
    if rest.lower() == "off" or not text:
        return (None,)
    return (text,)


def _toggle(spec: Spec, rest: str) -> tuple:
    if not rest:
        return ()
    if rest.lower() not in BOOL_WORDS:
        raise CommandError(f"/{spec.name} takes on or off, not {rest!r}")
    return (BOOL_WORDS[rest.lower()],)


def _path(spec: Spec, rest: str) -> tuple:
    path = unquote(rest)
    if not path:
        raise CommandError(f"usage: {spec.usage}")
    return (path,)


def _set(spec: Spec, rest: str) -> tuple:
    """() shows every setting; (key, value) changes one, with the value already of the right type."""
    if not rest:
        return ()
    key, _, value = rest.partition(" ")
    key, value = key.lower().replace("-", "_"), value.strip()
    if key == "temperature":
        key = "temp"
    if key not in SETTABLE:
        raise CommandError(f"no setting {key!r}{_suggest(key, SETTABLE)}; settings: {', '.join(SETTABLE)}")
    kind = SETTABLE[key][1]
    if kind == "bool":
        if not value:
            return (key, True)
        if value.lower() not in BOOL_WORDS:
            raise CommandError(f"{key} is on or off, not {value!r}")
        return (key, BOOL_WORDS[value.lower()])
    if not value:
        raise CommandError(f"give a value: /set {key} VALUE ({SETTABLE[key][2]})")
    if kind == "int?" and value.lower() in NONE_WORDS:
        return (key, None)
    try:
        return (key, float(value) if kind == "float" else int(value))
    except ValueError:
        noun = "a number" if kind == "float" else "a whole number" + (" or 'default'" if kind == "int?" else "")
        raise CommandError(f"{key} needs {noun}, not {value!r} ({SETTABLE[key][2]})") from None


_READERS = {"none": _none, "command": _command, "text": _text, "toggle": _toggle, "path": _path, "set": _set}


def unquote(text: str) -> str:
    """Strip one pair of surrounding quotes: \"\"\"...\"\"\", "..." or '...'."""
    text = text.strip()
    for q in ('"""', '"', "'"):
        if len(text) >= 2 * len(q) and text.startswith(q) and text.endswith(q):
            return text[len(q): -len(q)].strip()
    return text


def _suggest(word: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def complete(text: str) -> list[str]:
    """Tab candidates for the last word of `text`: command names, settings, on/off values."""
    if not is_command(text):
        return []
    parts = text[1:].split(" ")
    if len(parts) == 1:
        return ["/" + n for n in BY_NAME if n.startswith(parts[0].lower()) and n != "?"]
    spec = BY_NAME.get(parts[0].lower())
    options: list[str] = []
    if spec is None:
        return []
    if spec.args == "set" and len(parts) == 2:
        options = list(SETTABLE)
    elif spec.args == "set" and len(parts) == 3 and SETTABLE.get(parts[1], ("", ""))[1] == "bool":
        options = ["on", "off"]
    elif spec.args == "toggle" and len(parts) == 2:
        options = ["on", "off"]
    elif spec.args == "command" and len(parts) == 2:
        options = [s.name for s in SPECS]
    return [o for o in options if o.startswith(parts[-1].lower())]
