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
    from mlx_spec.distributed.cli import add_distributed_arguments

    add_distributed_arguments(p)  # --distributed: this terminal is rank 0; it starts (-n, --hostfile) or joins the others
    p.add_argument("-n", "--ranks", type=int, default=None,
                   help="with --distributed: start N local ranks (this process is rank 0)")
    p.add_argument("--hostfile", type=Path, default=None,
                   help="with --distributed: mlx.launch's host list, this machine first; the others start over ssh")


def run(args) -> int:
    if not args.distributed:
        from .session import Session  # (here, not at the top: `--help` should not wait for MLX and mlx-lm)

        return _run(args, lambda: load_from(args), Session)
    from mlx_spec.distributed import chat as dchat

    dist, followers = dchat.start(args)
    if not dist.is_root:
        return dchat.run_follower(dist, args)
    made = []

    def session(model, tokenizer):
        made.append(dchat.RootSession(model, tokenizer, dist, followers))
        return made[-1]

    def leave(worker, clean: bool):  # every way out: the followers exit with the chat (none is left running)
        if clean and made:  # the worker is idle: tell the followers, from the thread that runs MLX
            worker.call(made[0].shutdown)
        if followers is not None:
            followers.close(wait=5 if clean and made else 0)  # else (mid-round): end them now

    try:
        code = _run(args, lambda: dchat.load(dist, args), session, leave)
    except MlxSpecError as e:  # loading failed (on some rank): a ring with a dead peer may hang in teardown
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    _leave(code)


def _run(args, load, make_session, leave=lambda worker, clean: None) -> int:
    from .repl import Quit

    settings = Settings(sampling=sampling_from(args), max_tokens=args.max_tokens, block_size=args.block_size,
                        verbose=args.show_drafts, markdown=not args.no_markdown, stop=tuple(args.stop))
    if args.baseline_tokens < 0:
        raise MlxSpecError("--baseline-tokens must be 0 or more")
    conversation = _resume(args.resume) if args.resume else Conversation()
    if args.system is not None:
        conversation.system = args.system
    out, worker = Output(), Worker()
    try:
        code = _start(args, settings, conversation, out, worker, load, make_session)
    except KeyboardInterrupt:
        leave(worker, False)
        _leave(130)
    except Quit as q:
        leave(worker, False)
        _leave(q.code)
    except BaseException:
        leave(worker, False)
        raise
    leave(worker, True)
    return code


def _start(args, settings, conversation, out, worker, load, make_session) -> int:
    from .repl import Chat

    model, tokenizer = worker.call(load)
    session = make_session(model, tokenizer)
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
