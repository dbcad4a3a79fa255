"""What each slash command does. Arguments arrive parsed and typed (see commands.py)."""

from __future__ import annotations

from pathlib import Path

from mlx_spec.drafters import learnt_blocks, model_drafter
from mlx_spec.errors import MlxSpecError

from .commands import BY_NAME, SPECS
from .conversation import Conversation
from .render import legend
from .settings import SETTABLE, show
from .stats import report

EXIT = object()  # returned by a handler to end the chat

KEYS = [
    ('"""', 'start a multi-line message; end it with """ (a paste is one message too)'),
    ("Alt-Enter", "new line without sending"),
    ("Ctrl-C", "stop the reply (what came so far is kept); drop a typed line"),
    ("Ctrl-D", "leave"),
    ("Tab, ↑/↓, Ctrl-R", "complete a command; history; search history"),
    ("//text", "send a message that starts with '/'"),
]


def help_(chat, name: str | None = None):
    if name is not None:
        spec = BY_NAME[name]
        aliases = f" (also {', '.join('/' + a for a in spec.aliases)})" if spec.aliases else ""
        chat.out.say(f"{spec.usage}{aliases}: {spec.help}")
        if name == "set":
            for key, (_, _, text) in SETTABLE.items():
                chat.out.say(f"  {key:<11} {text} (now {show(key, chat.settings.get(key))})")
        return
    for spec in SPECS:
        aliases = f" (/{', /'.join(spec.aliases)})" if spec.aliases else ""
        chat.out.say(f"  {spec.usage:<20} {spec.help}{aliases}")
    chat.out.say()
    for key, text in KEYS:
        chat.out.say(f"  {key:<20} {text}")


def bye(chat):
    return EXIT


def clear(chat):
    chat.conversation.clear()
    chat.out.say("new conversation" + (" (system message kept)" if chat.conversation.system else ""))


def regen(chat):
    old = chat.conversation.pop() if chat.conversation.last("assistant") else None
    if not chat.conversation.last("user"):
        if old is not None:
            chat.conversation.turns.append(old)
        chat.out.hint("nothing to regenerate yet")
        return None
    if chat.settings.sampling.temperature == 0:
        chat.out.note("(temp is 0, so the reply comes out the same; /set temp 0.7 to vary it)")
    replied = False
    try:
        replied = chat.turn()
    finally:
        if not replied and old is not None:  # nothing new came: keep the reply we had
            chat.conversation.turns.append(old)


def system(chat, text: str | None = ...):
    conv = chat.conversation
    if text is ...:
        chat.out.say(f"system: {conv.system}" if conv.system else "no system message (/system TEXT sets one)")
        return
    conv.system = text
    chat.out.say("system message set" if text else "system message removed")


def set_(chat, key: str | None = None, value=None):
    if key is None:
        for k, v in chat.settings.describe():
            chat.out.say(f"  {k:<11} {v}")
        return
    try:
        if key == "block_size":
            chat.session.check_block_size(value)
        chat.settings = chat.settings.with_value(key, value)
    except MlxSpecError as e:
        chat.out.hint(f"{e} (still {show(key, chat.settings.get(key))})")
        return
    chat.out.say(f"{key} = {show(key, value)}")
    if key == "verbose" and value:
        chat.out.say(legend())
    if key == "block_size" and chat.session.drafter is None:
        chat.out.hint("no drafter is loaded: block_size matters only when drafting")


def draft(chat, on: bool | None = None):
    s = chat.session
    if on is not None:
        try:
            chat.worker.call(s.set_drafting, on)
        except MlxSpecError as e:
            chat.out.hint(str(e))
            return
    if s.speculative:
        chat.out.say(f"speculative decoding, {s.block_label(chat.settings)}")
    elif s.drafter is not None:
        chat.out.say("plain decoding: the next replies show its tokens/s (/draft on to compare)")
    else:
        chat.out.say("plain decoding (no drafter loaded)")


def stats(chat):
    curve = chat.worker.call(chat.session.cost_curve)
    for line in report(chat.last, chat.total, chat.session.baseline_tps, curve):
        chat.out.say(line)


def save(chat, path: str):
    p = Path(path).expanduser()
    m = chat.session.model
    try:
        chat.conversation.save(p, model=str(m.target_path), drafter=str(m.drafter_path) if m.drafter_path else None)
    except OSError as e:
        chat.out.hint(f"cannot save to {p}: {e.strerror or e}")
        return
    chat.out.say(f"saved {len(chat.conversation.messages())} messages to {p}")


def load(chat, path: str):
    p = Path(path).expanduser()
    try:
        chat.conversation = Conversation.load(p)
    except FileNotFoundError:
        chat.out.hint(f"no such file: {p}")
        return
    except IsADirectoryError:
        chat.out.hint(f"{p} is a folder, not a saved conversation")
        return
    except OSError as e:
        chat.out.hint(f"cannot read {p}: {e.strerror or e}")
        return
    except ValueError as e:
        chat.out.hint(f"{p} is not a saved conversation: {e}")
        return
    n = len(chat.conversation.turns)
    chat.out.say(f"loaded {n} messages from {p}" + (" (with a system message)" if chat.conversation.system else ""))


def model(chat):
    s = chat.session
    cfg = s.model.config
    chat.out.say(f"target   {s.model.target_path}")
    chat.out.say(f"         {cfg.get('model_type', '?')}, {cfg.get('num_hidden_layers', '?')} layers, "
                 f"hidden {cfg.get('hidden_size', '?')}, vocab {cfg.get('vocab_size', '?')}, "
                 f"context {s.model.context_length}")
    if s.drafter is None:
        chat.out.say("drafter  none")
    else:
        inner = model_drafter(s.drafter)
        kind = {"DFlashDrafter": "DFlash", "DSparkDrafter": "DSpark", "LookupDrafter": "prompt lookup (no model)",
                "DraftModelDrafter": "draft model"}.get(type(inner).__name__, type(inner).__name__)
        if inner is not s.drafter:
            kind += ", or prompt lookup where this conversation favours it"
        chat.out.say(f"drafter  {kind}" + (f", {s.model.drafter_path}" if s.model.drafter_path else ""))
        taps = f", reads target layers {list(s.drafter.tap_ids)}" if s.drafter.tap_ids else ""
        sizes = [b for b in learnt_blocks(inner) if b < s.drafter.block_size]
        short = f" (short drafts from {', '.join(map(str, sizes))})" if sizes else ""
        chat.out.say(f"         block size {s.drafter.block_size}{short}{taps}")
    mode = f"speculative, {s.block_label(chat.settings)}" if s.speculative else "plain"
    chat.out.say(f"decoding {mode}")


HANDLERS = {"help": help_, "bye": bye, "clear": clear, "regen": regen, "system": system, "set": set_,
            "draft": draft, "stats": stats, "save": save, "load": load, "model": model}
