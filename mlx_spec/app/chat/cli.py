"""`mlx-spec chat`: a multi-turn terminal chat that shows what speculation is doing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mlx_spec.history import add_learn_arguments, recorder_from
from mlx_spec.options import add_model_arguments, add_sampling_arguments, load_from, sampling_from
from mlx_spec.errors import MlxSpecError

from .conversation import Conversation
from .prompt import LineInput, TerminalInput, default_history
from .render import Output, legend
from .repl import Chat, Quit
from .session import Session
from .settings import Settings
from .worker import Worker


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_sampling_arguments(p)
    p.set_defaults(max_tokens=Settings().max_tokens)
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--show-drafts", action="store_true",
                   help="live view of speculation: accepted draft tokens in green, target tokens in bold")
    p.add_argument("--no-markdown", action="store_true", help="print replies as plain text")
    p.add_argument("--resume", type=Path, default=None, metavar="FILE",
                   help="start from a conversation saved with /save")
    p.add_argument("--history", type=Path, default=None,
                   help="input history file (default: $XDG_STATE_HOME/mlx-spec/chat_history, "
                        "else ~/.local/state/mlx-spec/chat_history)")
    p.add_argument("--no-history", action="store_true", help="keep no input history on disk")
    add_learn_arguments(p)
    p.add_argument("--baseline-tokens", type=int, default=32,
                   help="plain-decoding tokens measured at start-up for the speedup estimate (0: skip)")
    p.add_argument("--distributed", action="store_true",
                   help="not available for chat: run `serve --distributed` under mlx.launch and chat through it")


def run(args) -> int:
    if args.distributed:  # mlx.launch gives its ranks no terminal to read from
        raise MlxSpecError("chat --distributed is not supported: mlx.launch gives the ranks no terminal; run "
                           "`mlx.launch ... -- mlx-spec serve --distributed` and chat through the server")
    settings = Settings(sampling=sampling_from(args), max_tokens=args.max_tokens, block_size=args.block_size,
                        verbose=args.show_drafts, markdown=not args.no_markdown, stop=tuple(args.stop))
    if args.baseline_tokens < 0:
        raise MlxSpecError("--baseline-tokens must be 0 or more")
    conversation = _resume(args.resume) if args.resume else Conversation()
    if args.system is not None:
        conversation.system = args.system
    out, worker = Output(), Worker()
    try:
        return _start(args, settings, conversation, out, worker)
    except KeyboardInterrupt:
        _leave(130)
    except Quit as q:
        _leave(q.code)


def _start(args, settings, conversation, out, worker) -> int:
    model, tokenizer = worker.call(load_from, args)
    session = Session(model, tokenizer)
    session.check_block_size(settings.block_size)
    if args.baseline_tokens:
        worker.call(session.measure_baseline, args.baseline_tokens)
    if settings.block_size is None:
        worker.call(session.cost_curve)  # measured once per model and machine: before the first reply, not in it
    if sys.stdin.isatty() and sys.stdout.isatty():
        reader = TerminalInput(None if args.no_history else args.history or default_history())
    else:
        reader = LineInput()
    chat = Chat(session, worker, reader, out, settings, conversation, recorder=recorder_from(args, model.target_path))
    _banner(chat)
    if reader.warning:
        out.hint(reader.warning)
    return chat.run()


def _banner(chat) -> None:
    s, out = chat.session, chat.out
    pair = s.model.target_path.name if s.model.target_path.name != "target" else str(s.model.target_path)
    if s.drafter is not None:
        pair += f" + drafter, {s.block_label(chat.settings)}"
    else:
        pair += ", no drafter"
    base = f" · plain decoding {s.baseline_tps:.1f} tok/s" if s.baseline_tps else ""
    out.note(f"mlx-spec chat · {pair}{base}")
    if chat.conversation.turns:
        out.note(f"resumed a conversation of {len(chat.conversation.turns)} messages")
    if chat.recorder is not None:
        out.note(f"--learn: recording prompt and reply token ids to {chat.recorder.folder} (mlx-spec history)")
    if chat.settings.verbose:
        out.say(legend())
    out.note("/? for help · Ctrl-C stops a reply · Ctrl-D leaves")


def _resume(path: Path) -> Conversation:
    try:
        return Conversation.load(path.expanduser())
    except (OSError, ValueError) as e:
        raise MlxSpecError(f"cannot resume from {path}: {getattr(e, 'strerror', None) or e}") from None


def _leave(code: int) -> None:
    # The worker may be mid-round inside MLX: skip interpreter teardown rather than race it.
    print(file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
