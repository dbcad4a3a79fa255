"""`mlx-spec` entry point: one module per subcommand, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "generate": ("mlx_spec.commands.generate", "generate text (speculatively when a drafter is available)"),
    "chat": ("mlx_spec.app.chat.cli", "chat in the terminal, with live speculation stats"),
    "train-target": ("mlx_spec.commands.train_target", "train the embedded target model from the offline corpus"),
    "serve": ("mlx_spec.app.server.cli", "OpenAI-compatible HTTP server (chat, completions, metrics)"),
    "train-drafter": ("mlx_spec.commands.train_drafter", "train a DFlash drafter on the target's own answers"),
    "eval-drafter": ("mlx_spec.commands.eval_drafter", "measure a drafter's acceptance length with the real loop"),
    "eval-target": ("mlx_spec.commands.eval_target", "a target's held-out loss and the repetition of its answers"),
    "doctor": ("mlx_spec.commands.doctor", "show the device, BLAS, versions and the measured cost curve"),
    "bench": ("mlx_spec.commands.bench", "plain vs speculative decoding, side by side, per kind of prompt"),
    "history": ("mlx_spec.commands.history", "what --learn recorded for a target (size, per-day counts, τ), or --clear"),
    "adapt": ("mlx_spec.commands.adapt", "fine-tune the drafter on your recorded traffic; --rollback undoes it"),
    "convert": ("mlx_spec.commands.convert", "Hugging Face checkpoint to an MLX folder, keeping its drafter (MTP) weights"),
}


def main(argv: list[str] | None = None) -> int:
    from .errors import MlxSpecError

    parser = argparse.ArgumentParser(prog="mlx-spec", description="Lossless speculative decoding on MLX.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, (module, help_text) in COMMANDS.items():
        modules[name] = module
        sub.add_parser(name, help=help_text, description=help_text)
    if argv is None:
        from .platform_blas import maybe_reexec

        argv = sys.argv[1:]
        maybe_reexec(argv)  # Linux: an optimized BLAS makes float32 GEMMs ~30x faster
    # Parse the command name first, then let its module declare its own options.
    known, _ = parser.parse_known_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    mod = importlib.import_module(modules[known.command])
    cmd_parser = argparse.ArgumentParser(prog=f"mlx-spec {known.command}", description=COMMANDS[known.command][1])
    mod.add_arguments(cmd_parser)
    args = cmd_parser.parse_args(argv[1:])
    try:
        return mod.run(args) or 0
    except MlxSpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
