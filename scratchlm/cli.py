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


_TRAIN_EPILOG = """\
Every training and model field is a flag (underscores or dashes: --n_layer 6, --n-layer 6); a
--preset sets many at once and flags given after it change single fields. Booleans take
--compile / --no-compile. `none` sets an optional field to None. The defaults listed are the
config classes' own; print a preset's values with --preset NAME --show-config.

Multi-process: torchrun --nproc_per_node 4 -m scratchlm train ... (DDP; add --fsdp to shard);
multi-node: torchrun --nnodes 2 --node_rank R --nproc_per_node 8 --rdzv-backend c10d
--rdzv-endpoint HOST:29500 -m scratchlm train ...
"""


def _parse_field_value(kind: str, optional: bool):
    def parse(text: str):
        if optional and text.lower() == "none":
            return None
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        return text

    parse.__name__ = kind  # argparse names the type in its error message
    return parse


def _add_train(sub) -> None:
    from scratchlm.train import TRAIN_PRESETS, cli_fields

    p = sub.add_parser("train", help="train a model (default preset: shakespeare-char)", epilog=_TRAIN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=None, choices=list(TRAIN_PRESETS),
                   help="training preset (default: shakespeare-char, unless --resume)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run in RUN_DIR from its latest checkpoint (its saved config, plus any flags given)")
    p.add_argument("--show-config", action="store_true", help="print the resolved config as JSON and exit")
    train_group = p.add_argument_group("training fields (TrainConfig)")
    model_group = p.add_argument_group("model fields (GPTConfig; vocab_size comes from the tokenizer)")
    for f in cli_fields():
        group = model_group if f.model else train_group
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        dest = ("model." if f.model else "train.") + f.name
        help_text = f"{f.doc} (default: {f.default})".replace("%", "%%")
        if f.kind == "bool":
            group.add_argument(*names, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=help_text)
        else:
            group.add_argument(*names, dest=dest, type=_parse_field_value(f.kind, f.optional),
                               default=argparse.SUPPRESS, metavar=f.kind.upper(), help=help_text)
    p.set_defaults(run=_run_train)


def _run_train(args) -> int:
    import json

    from scratchlm.train import config_from_preset, resume_config, train

    given = vars(args)
    train_overrides = {k[len("train."):]: v for k, v in given.items() if k.startswith("train.")}
    model_overrides = {k[len("model."):]: v for k, v in given.items() if k.startswith("model.")}
    if args.resume:
        if model_overrides or args.preset:
            raise UserError("--resume continues an existing model; drop --preset and the model flags")
        cfg = resume_config(args.resume, **train_overrides)
    else:
        cfg = config_from_preset(args.preset or "shakespeare-char", **train_overrides, model_overrides=model_overrides)
    if args.show_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    result = train(cfg)
    if result.stopped:
        return 130
    if result.sample is not None:
        print(f"sample:\n{result.sample}")
    print(f"continue a prompt with: scratchlm generate --checkpoint {result.run_dir}")
    return 0


def _add_plot(sub) -> None:
    p = sub.add_parser("plot", help="draw a run's train and validation loss curves to a PNG")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by scratchlm train")
    p.add_argument("--out", default=None, help="PNG file to write (default: RUN_DIR/loss.png)")
    p.set_defaults(run=_run_plot)


def _run_plot(args) -> int:
    from scratchlm.plot import plot_run

    print(plot_run(args.run_dir, args.out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchlm", description="A GPT built from scratch, every step visible.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_inspect(sub)
    _add_train(sub)
    _add_plot(sub)
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
