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


def _add_prepare(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize text into train/val token shards (and a tokenizer)")
    p.add_argument("--data", nargs="+", default=["shakespeare"], metavar="SOURCE",
                   help="`shakespeare` (built in), or .txt/.jsonl/.parquet files and folders (default: shakespeare)")
    p.add_argument("--tokenizer", choices=["char", "bpe", "gpt2"], default="bpe", help="tokenizer kind (default: bpe)")
    p.add_argument("--vocab-size", type=int, default=None, help="bpe: vocabulary size to train (default: 8192)")
    p.add_argument("--tokenizer-file", default=None,
                   help="gpt2: a gpt2.tiktoken rank file (offline); bpe: a tokenizer.json; any: a saved tokenizer folder")
    p.add_argument("--out", default=None,
                   help="output folder (default: the cache folder that `train` looks in for the same settings)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share held out for validation (default: 0.1)")
    p.add_argument("--split", choices=["tail", "documents"], default="tail",
                   help="tail: last tokens are validation (default); documents: a seeded random set of documents")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with its position (default) or replace it with U+FFFD")
    p.add_argument("--seed", type=int, default=0, help="seed of the documents split (default: 0)")
    p.add_argument("--block-size", type=int, default=None, help="check that each split holds a window of this many + 1 tokens")
    p.add_argument("--char-unk", action="store_true", help="char: add an <unk> id for characters the text lacks")
    p.set_defaults(run=_run_prepare)


def _run_prepare(args) -> int:
    from scratchlm.data import DataConfig, cache_dir, prepare, read_meta

    cfg = DataConfig(data=args.data, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                     tokenizer_file=args.tokenizer_file, val_fraction=args.val_fraction, split=args.split,
                     seed=args.seed, errors=args.errors, char_unk=args.char_unk, block_size=args.block_size)
    out = prepare(cfg, args.out if args.out else cache_dir(cfg))
    m = read_meta(out)
    sec = m["seconds"]
    mb = m["input_bytes"] / 1e6
    print(f"prepared {out}")
    print(f"  tokenizer   {m['tokenizer']}, vocab {m['vocab_size']:,} (bos {m['bos_id']}, eos {m['eos_id']}), shards {m['dtype']}")
    print(f"  input       {len(m['sources'])} file(s), {m['documents']:,} documents, {mb:.2f} MB of text")
    print(f"  train       {m['train_tokens']:,} tokens, {m['train_documents']:,} documents, {m['train_bytes']:,} bytes")
    print(f"  val         {m['val_tokens']:,} tokens, {m['val_documents']:,} documents, {m['val_bytes']:,} bytes ({m['split']} split)")
    print(f"  time        tokenizer {sec['tokenizer']:.2f} s, encoding {sec['encode']:.2f} s "
          f"({mb / max(sec['encode'], 1e-9):.1f} MB/s), total {sec['total']:.2f} s ({mb / max(sec['total'], 1e-9):.1f} MB/s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchlm", description="A GPT built from scratch, every step visible.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_inspect(sub)
    _add_prepare(sub)
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
