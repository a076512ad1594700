"""The `scratchlm` command: argparse subcommands that build configs and call library functions.

Each subcommand is an `_add_<name>` function (its flags) and a `_run_<name>` function (the call).
A `UserError` becomes one `error: ...` line on stderr and exit status 2; `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from scratchlm.errors import UserError


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="shapes at every station and parameter counts of a model")
    p.add_argument("--preset", default="smoke", help="model preset name (default: smoke)")
    p.add_argument("--batch-size", "-B", type=int, default=2, help="B of the traced batch (default: 2)")
    p.add_argument("--seq-len", "-T", type=int, default=16, help="T of the traced batch (default: 16)")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    from scratchlm.config import GPTConfig
    from scratchlm.introspect import format_inspect
    from scratchlm.model import GPT

    cfg = GPTConfig.from_name(args.preset)
    if args.batch_size <= 0 or args.seq_len <= 0:
        raise UserError("--batch-size and --seq-len must be positive")
    if args.seq_len > cfg.block_size:
        raise UserError(f"--seq-len {args.seq_len} exceeds the preset's context length block_size={cfg.block_size}")
    print(format_inspect(GPT(cfg), args.batch_size, args.seq_len))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchlm", description="A GPT built from scratch, every step visible.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_inspect(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
