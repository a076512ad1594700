"""The commands that look inside a model or a run: `inspect`, `walkthrough`, `attention`, `plot`
and `doctor`. scratchlm.cli.main builds the parser and calls `add_<name>` here for each; the `_run_<name>`
functions do the work, as in scratchlm.cli.main."""

from __future__ import annotations

import json

from scratchlm.cli.flags import add_model_flags, model_overrides
from scratchlm.errors import UserError, check_output_file

ATTENTION_MEGAPIXELS = 200
"""The largest attention picture drawn (about 800 MB of pixels in memory)."""


def add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="shapes at every station, parameter counts, FLOPs and training memory of a model")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", default=None, help="model preset name (default: smoke)")
    src.add_argument("--checkpoint", metavar="DIR", help="a run or checkpoint directory to inspect instead")
    p.add_argument("--batch-size", "-B", type=int, default=2, help="B of the traced batch (default: 2)")
    p.add_argument("--seq-len", "-T", type=int, default=16, help="T of the traced batch (default: 16)")
    p.add_argument("--train-batch", type=int, default=8, help="batch size for the memory estimate (default: 8)")
    p.add_argument("--train-seq-len", type=int, default=None,
                   help="context length for the FLOP and memory figures (default: the model's block_size)")
    p.add_argument("--lora-rank", type=int, default=None, metavar="R",
                   help="also count what LoRA of rank R trains: r x (d_in + d_out) per adapted matrix")
    p.add_argument("--lora-targets", default="all", help="the matrices LoRA adapts (as train's --lora_targets; default: all)")
    p.add_argument("--json", action="store_true", help="print the same report as JSON")
    add_model_flags(p, "--n_layer 6, --pos_embedding rope, --tie_weights ... (not with --checkpoint)")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    import json

    from scratchlm.inside.introspect import format_report, inspect_report

    model = _load_model_for(args, default_preset="smoke")
    cfg = model.config
    for flag, value in (("--batch-size", args.batch_size), ("--seq-len", args.seq_len),
                        ("--train-batch", args.train_batch), ("--train-seq-len", args.train_seq_len)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} must be positive, got {value}")
    if args.seq_len > cfg.block_size:
        raise UserError(f"--seq-len {args.seq_len} exceeds the model's context length block_size={cfg.block_size}")
    if args.train_seq_len is not None and args.train_seq_len > cfg.block_size:
        raise UserError(f"--train-seq-len {args.train_seq_len} exceeds the model's context length block_size={cfg.block_size}")
    _check_trace_fits(model, args.batch_size, args.seq_len)
    report = inspect_report(model, args.batch_size, args.seq_len, args.train_batch, args.train_seq_len)
    lora = _lora_counts(cfg, args.lora_rank, args.lora_targets, model.num_params()) if args.lora_rank is not None else None
    if args.json:
        print(json.dumps({**report, "lora": {k: v for k, v in lora.items() if k != "lines"}} if lora else report, indent=2))
    else:
        print(format_report(report) + ("\n\n" + "\n".join(lora["lines"]) if lora else ""))
    return 0


def _lora_counts(cfg, rank: int, targets: str, total: int) -> dict:
    """What LoRA of `rank` trains in a model of `cfg`: each adapted matrix's r x (d_in + d_out), times the layers."""
    from scratchlm.model.lora import count_trainable, parse_targets

    if rank <= 0:
        raise UserError(f"--lora-rank must be positive, got {rank}")
    try:
        found = count_trainable(cfg, rank, parse_targets(targets))
    except ValueError as exc:
        raise UserError(f"--lora-targets: {exc}") from None
    trained = cfg.n_layer * sum(n for *_, n in found)
    lines = [f"LoRA of rank {rank} (B = 0 at the start): what it trains, per block"]
    lines += [f"  {name:<12} r x (d_in + d_out) = {rank} x ({d_in:,} + {d_out:,}) = {n:,}" for name, d_in, d_out, n in found]
    lines.append(f"  x {cfg.n_layer} blocks = {trained:,} trainable of {total:,} parameters ({100 * trained / total:.2f}%)")
    per = [{"target": name, "d_in": d_in, "d_out": d_out, "trainable": n} for name, d_in, d_out, n in found]
    return {"rank": rank, "per_block": per, "trainable": trained, "total": total, "lines": lines}


def _check_trace_fits(model, batch: int, seq_len: int) -> None:
    """The traced batch, before it is made: a model of a preset lives on the meta device, where
    only its ids take memory; a checkpoint's model runs the whole forward pass."""
    from scratchlm.machine.memory import ID, Footprint, check_batch_fits, check_fits

    device = next(model.parameters()).device
    what, knobs = f"tracing a batch of {batch:,} x {seq_len:,} tokens", "--batch-size or --seq-len"
    if device.type == "meta":
        check_fits(Footprint(activations=ID * batch * seq_len), "cpu", what, knobs)
    else:
        check_batch_fits(model.config, device, batch, seq_len, what, knobs)


def _load_model_for(args, default_preset: str):
    """The model named by --checkpoint (a run or checkpoint dir) or --preset.

    A preset is built on the meta device: shapes and counts need no weights, and seed-400m
    then costs no memory and no initialisation time."""
    overrides = model_overrides(args)
    if getattr(args, "checkpoint", None):
        from scratchlm.checkpoint import load_model

        if overrides:
            raise UserError("--checkpoint shows the model it holds; drop the model flags "
                            f"({', '.join('--' + k for k in sorted(overrides))})")
        model, _, _ = load_model(args.checkpoint)
        return model
    import torch

    from scratchlm.model.config import GPTConfig
    from scratchlm.model.gpt import GPT

    cfg = GPTConfig.from_name(args.preset or default_preset, **overrides)
    from scratchlm.machine.memory import check_meta_model_fits

    check_meta_model_fits(cfg, f"the shapes of a model of {cfg.n_layer:,} layers", "--n_layer")
    with torch.device("meta"):
        return GPT(cfg)


def add_walkthrough(sub) -> None:
    p = sub.add_parser("walkthrough", help="every matrix of one tiny forward pass, loss, backward pass, AdamW step and "
                                           "next token, torch beside the NumPy twin")
    p.add_argument("--preset", default=None, help="model preset (default: hand: T=3, C=2, H=2, V=5)")
    p.add_argument("--checkpoint", metavar="RUN_OR_CKPT_DIR", help="walk a trained model instead: --layer/--head "
                                                                    "in full, every other station as one line")
    p.add_argument("--text", help="with --checkpoint: the input as text, encoded by the run's tokenizer")
    p.add_argument("--layer", type=int, default=0, help="with --checkpoint: the layer printed in full (default: 0)")
    p.add_argument("--head", type=int, default=0, help="with --checkpoint: the head printed in full (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random initial weights and of the sampled "
                                                       "next token (default: 0)")
    p.add_argument("--tokens", metavar="A,B,...", help="names for the vocabulary's ids, one per id, which also sets "
                                                       "V (e.g. 床,前,明,月,山)")
    p.add_argument("--ids", default=None, help="comma-separated input ids, or token names from --tokens "
                                               "(default: 1,3,2)")
    p.add_argument("--targets", default=None, help="comma-separated target ids or names, one per input (default: the "
                                                   "input shifted left by one, then the id after the last)")
    # the default (walkthrough_train.WALK_LR) is read when the command runs: that module imports torch
    p.add_argument("--lr", type=float, default=None, help="AdamW's learning rate for the step (default: 0.01)")
    p.add_argument("--forward-only", action="store_true", help="stop at the probabilities (no loss, backward or step)")
    p.add_argument("--init", choices=("hand", "model"), default="hand",
                   help="hand: weights are multiples of 0.1 in [-1, 1], biases 0 (default); model: the model's own init")
    p.add_argument("--float32", action="store_true", help="compute in float32 instead of float64")
    p.add_argument("--json", action="store_true", help="print the same as JSON")
    # --init here is the walkthrough's; dropout would make the two sides draw different masks
    add_model_flags(p, "--pos_embedding rope, --norm_position post, --tie_weights ...", skip=("init", "dropout"),
                    preset="hand")
    p.set_defaults(run=_run_walkthrough)


def _id_list(text: str, flag: str, labels: list[str] | None) -> list[int]:
    """Comma-separated ids, or names from --tokens."""
    ids = []
    for item in (x.strip() for x in text.split(",")):
        if labels and item in labels:
            ids.append(labels.index(item))
        elif item.lstrip("-").isdigit():
            ids.append(int(item))
        elif item:
            known = f" or one of --tokens {','.join(labels)}" if labels else ""
            raise UserError(f"{flag}: {item!r} is not a whole number{known}")
    return ids


def _walk_config(args):
    from scratchlm.model.config import GPTConfig

    labels = None
    overrides = model_overrides(args)
    if args.tokens is not None:
        labels = [t.strip() for t in args.tokens.split(",")]
        if len(labels) < 2 or "" in labels or len(set(labels)) != len(labels):
            raise UserError(f"--tokens: give two or more different, non-empty names, got {args.tokens!r}")
        overrides["vocab_size"] = len(labels)
    return GPTConfig.from_name(args.preset, **overrides), labels


def _run_walkthrough(args) -> int:
    import torch

    from scratchlm.inside.walkthrough import (WALKTHROUGH_IDS, WALKTHROUGH_MAX_LINES, WALKTHROUGH_MAX_ROW, format_walkthrough,
                                       printed_size, walkthrough_json, walkthrough_model, walkthrough_of)
    from scratchlm.inside.walkthrough_train import default_targets, format_training, training_json, training_size, training_walk

    if args.lr is None:
        from scratchlm.inside.walkthrough_train import WALK_LR

        args.lr = WALK_LR
    if not args.lr > 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    if args.checkpoint:
        return _walk_checkpoint(args)
    if args.text is not None:
        raise UserError("--text needs --checkpoint (a preset has no tokenizer; use --tokens and --ids)")
    args.preset = args.preset or "hand"
    cfg, labels = _walk_config(args)
    ids = list(WALKTHROUGH_IDS)[: cfg.block_size] if args.ids is None else _id_list(args.ids, "--ids", labels)
    if not ids or len(ids) > cfg.block_size or any(not 0 <= i < cfg.vocab_size for i in ids):
        raise UserError(f"--ids: give 1 to {cfg.block_size} ids in 0..{cfg.vocab_size - 1} for preset {args.preset}")
    ids = [i % cfg.vocab_size for i in ids]
    targets = default_targets(ids, cfg.vocab_size) if args.targets is None else _id_list(args.targets, "--targets", labels)
    if len(targets) != len(ids) or any(not 0 <= t < cfg.vocab_size for t in targets):
        raise UserError(f"--targets: give {len(ids)} ids in 0..{cfg.vocab_size - 1}, one per input id")
    if cfg.n_layer > WALKTHROUGH_MAX_LINES:  # each layer prints lines of its own: refused before a model is made
        raise UserError(f"--n_layer {cfg.n_layer:,}: the walkthrough prints several lines a layer, at most "
                        f"{WALKTHROUGH_MAX_LINES:,} in all; it is for hand-sized models: use a few layers, or "
                        "`scratchlm inspect` for shapes at any size")
    lines, widest = printed_size(cfg, len(ids))
    if not args.forward_only:
        more, wide = training_size(cfg, len(ids))
        lines, widest = lines + more, max(widest, wide)
    if lines > WALKTHROUGH_MAX_LINES or widest > WALKTHROUGH_MAX_ROW:
        raise UserError(f"--preset {args.preset}: the walkthrough would print about {lines:,} lines, up to {widest:,} "
                        f"numbers wide (at most {WALKTHROUGH_MAX_LINES:,} and {WALKTHROUGH_MAX_ROW}); it is for "
                        "hand-sized models: use --preset hand, or `scratchlm inspect` for shapes at any size")
    model = walkthrough_model(cfg, args.seed, args.init, torch.float32 if args.float32 else torch.float64)
    w = walkthrough_of(model, ids, preset=args.preset, seed=args.seed, init=args.init)
    tw = None if args.forward_only else training_walk(model, ids, targets, lr=args.lr, seed=args.seed)
    if args.json:
        data = walkthrough_json(w)
        data["labels"] = labels
        if tw is not None:
            data["training"] = training_json(tw)
        print(json.dumps(data, indent=1))
    else:
        print(format_walkthrough(w, labels) + ("" if tw is None else format_training(tw, ids, labels)))
    return 0


def add_tokenize(sub) -> None:
    p = sub.add_parser("tokenize", help="text -> pieces -> ids, with BOS, and the training row's x / y shift")
    p.add_argument("text", nargs="?", help="the text (default: stdin)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tokenizer", choices=("char", "bpe", "gpt2"), default="char",
                     help="char: the characters of this text; bpe: a byte-level BPE trained on this text alone "
                          "(--vocab-size); gpt2: GPT-2's (default: char)")
    src.add_argument("--checkpoint", metavar="RUN_OR_CKPT_DIR", help="the tokenizer a run trained with")
    p.add_argument("--vocab-size", type=int, default=300, help="size of the bpe tokenizer to train (default: 300: "
                                                                "256 bytes, 2 special ids, 42 merges)")
    p.add_argument("--tokenizer-file", metavar="PATH", help="gpt2: its gpt2.tiktoken rank file (works offline)")
    p.add_argument("--block-size", type=int, help="cut the training row to block_size + 1 ids (default: all)")
    p.add_argument("--json", action="store_true", help="print the same as JSON")
    p.set_defaults(run=_run_tokenize)


STDIN_CHARS = 1_000_000
"""The most of stdin `tokenize` reads: a text to look at, not a corpus."""


def _run_tokenize(args) -> int:
    from scratchlm.inside.tokenize_view import format_tokenize, tokenize_report
    from scratchlm.text.text_files import argument_text, stdin_text

    if args.text is not None:
        text = argument_text(args.text, "the text argument")
    else:
        text = stdin_text(STDIN_CHARS)[:STDIN_CHARS]
    if not text:
        raise UserError("give some text to tokenize (an argument, or on stdin)")
    if args.block_size is not None and args.block_size < 1:
        raise UserError(f"--block-size must be positive, got {args.block_size}")
    tokenizer, source = _tokenizer_for(args, text)
    report = tokenize_report(tokenizer, text, source, args.block_size)
    print(json.dumps(report, ensure_ascii=False, indent=1) if args.json else format_tokenize(report, tokenizer))
    return 0


def _tokenizer_for(args, text: str):
    from scratchlm.text.tokenizer import get_tokenizer, train_tokenizer

    if args.checkpoint:
        from scratchlm.checkpoint import load_tokenizer_near, resolve_checkpoint

        tokenizer = load_tokenizer_near(resolve_checkpoint(args.checkpoint))
        if tokenizer is None:
            raise UserError(f"{args.checkpoint}: no tokenizer saved with this checkpoint or its run")
        return tokenizer, f"the tokenizer of {args.checkpoint}"
    if args.tokenizer == "char":
        return train_tokenizer("char", [text]), "the characters of this text"
    if args.tokenizer == "bpe":
        return train_tokenizer("bpe", [text], args.vocab_size), f"trained on this text alone, up to {args.vocab_size} ids"
    return get_tokenizer("gpt2", tokenizer_file=args.tokenizer_file), "GPT-2's 50,257 ids"


def _walk_checkpoint(args) -> int:
    from scratchlm.checkpoint import load_model
    from scratchlm.inside.walkthrough import format_focus, walkthrough_json
    from scratchlm.inside.walkthrough_run import label_of, text_row, walk_limit, walk_run
    from scratchlm.inside.walkthrough_train import (default_targets, format_training_summary, training_json,
                                             training_walk)

    given = [flag for flag, on in (("--preset", args.preset), ("--tokens", args.tokens), ("--float32", args.float32),
                                   ("--init", args.init != "hand")) if on] + [f"--{k}" for k in model_overrides(args)]
    if given:
        raise UserError(f"--checkpoint walks the model it holds; drop {', '.join(given)}")
    model, tokenizer, _ = load_model(args.checkpoint)
    cfg = model.config
    if tokenizer is None and args.ids is None:
        raise UserError(f"{args.checkpoint}: no tokenizer saved with it; give the input as --ids")
    if args.text is not None and args.ids is not None:
        raise UserError("give the input as --text or as --ids, not both")
    if args.ids is not None:
        ids = _id_list(args.ids, "--ids", None)
        targets = None if args.targets is None else _id_list(args.targets, "--targets", None)
    else:  # the text is a training row: BOS (a document's start), then its ids
        ids, targets = text_row(tokenizer, args.text if args.text is not None else "ROMEO:")
    most = walk_limit(model)
    if not ids or len(ids) > most or any(not 0 <= i < cfg.vocab_size for i in ids):
        raise UserError(f"the input must be 1 to {most} tokens with ids in "
                        f"0..{cfg.vocab_size - 1}; got {len(ids)} tokens")
    for flag, value, n in (("--layer", args.layer, cfg.n_layer), ("--head", args.head, cfg.n_head)):
        if not 0 <= value < n:
            raise UserError(f"{flag} {value} does not exist; the model has {n} (0..{n - 1})")
    # loaded for this walk alone: changed in place (dropout off, float64), not copied
    run = walk_run(model, tokenizer, ids, str(args.checkpoint), in_place=True)
    w, labels, top = run.walk, run.labels, run.top
    targets = default_targets(ids, cfg.vocab_size) if targets is None else targets
    if len(targets) != len(ids) or any(not 0 <= t < cfg.vocab_size for t in targets):
        raise UserError(f"--targets: give {len(ids)} ids in 0..{cfg.vocab_size - 1}, one per input id")
    tw = None if args.forward_only else training_walk(run.model, ids, targets, lr=args.lr, seed=args.seed)
    if args.json:
        data = {**walkthrough_json(w), "labels": labels, "next": top}
        if tw is not None:
            data["training"] = training_json(tw)
        print(json.dumps(data))
        return 0
    text = format_focus(w, args.layer, args.head, labels, top, str(args.checkpoint))
    if tw is not None:
        text += format_training_summary(tw, labels, [label_of(tokenizer, t) for t in targets])
    print(text)
    return 0


def add_attention(sub) -> None:
    p = sub.add_parser("attention", help="attention heatmaps per layer and head for a prompt (PNG)")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a run or checkpoint directory")
    p.add_argument("--prompt", required=True, help="the text whose attention to draw")
    p.add_argument("--out", required=True, metavar="FILE.png", help="where to write the PNG")
    p.add_argument("--layer", type=int, action="append", help="only this layer (repeatable; default: all)")
    p.add_argument("--head", type=int, action="append", help="only this head (repeatable; default: all)")
    p.add_argument("--dpi", type=int, default=100, help="pixels per inch; each panel is 3 x 3 inches (default: 100)")
    p.add_argument("--force", action="store_true", help="write --out even when its name does not end in .png")
    p.set_defaults(run=_run_attention)


def _run_attention(args) -> int:
    import sys
    import warnings
    from pathlib import Path

    from scratchlm.checkpoint import load_model
    from scratchlm.inside.attention_maps import attention_figure, attention_weights, save_figure, token_labels
    from scratchlm.outdir import check_not_input

    check_output_file(args.out, ".png", "--out", args.force)
    if not 10 <= args.dpi <= 1000:
        raise UserError(f"--dpi must be between 10 and 1000 (each panel is 3 x 3 inches), got {args.dpi}")
    model, tokenizer, info = load_model(args.checkpoint)
    ckpt = Path(info["checkpoint"])  # what was read: the checkpoint, its run's tokenizer and `latest`
    check_not_input(args.out, [ckpt, ckpt.parent / "tokenizer", ckpt.parent / "latest"], "--out")
    if tokenizer is None:
        raise UserError(f"{args.checkpoint}: has no saved tokenizer, so the prompt cannot be turned into token ids")
    panels = len(args.layer or range(model.config.n_layer)) * len(args.head or range(model.config.n_head))
    megapixels = panels * (3 * args.dpi) ** 2 / 1e6
    if megapixels > ATTENTION_MEGAPIXELS:
        raise UserError(f"{panels} panels at --dpi {args.dpi} make a {megapixels:,.0f}-megapixel picture (at most "
                        f"{ATTENTION_MEGAPIXELS}); lower --dpi or pick panels with --layer / --head")
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise UserError("--prompt is empty after tokenization; give some text")
    if len(ids) > model.config.block_size:
        raise UserError(f"the prompt is {len(ids)} tokens, longer than the context length {model.config.block_size}; shorten it")
    from scratchlm.machine.memory import check_batch_fits

    check_batch_fits(model.config, next(model.parameters()).device, 1, len(ids), f"the attention maps of "
                     f"{len(ids):,} tokens", "the prompt's length", attention_maps=True)
    weights = attention_weights(model, ids)
    try:
        with warnings.catch_warnings(record=True) as caught_early:
            warnings.simplefilter("always")
            fig = attention_figure(weights, token_labels(tokenizer, ids), layers=args.layer, heads=args.head,
                                   dpi=args.dpi)
    except ValueError as exc:
        raise UserError(f"{exc}; choose with --layer / --head") from None
    for w in caught_early:
        print(f"warning: {w.message}", file=sys.stderr)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = save_figure(fig, args.out)
    for w in caught:  # one plain line each (no font for some labels), not Python's warning format
        print(f"warning: {w.message}", file=sys.stderr)
    print(f"wrote {out} ({sum(1 for ax in fig.axes if ax.images)} panels, {len(ids)} tokens)")
    return 0


def add_plot(sub) -> None:
    p = sub.add_parser("plot", help="draw a run's train and validation loss curves to a PNG")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by scratchlm train")
    p.add_argument("--out", default=None, help="PNG file to write (default: RUN_DIR/loss.png)")
    p.add_argument("--force", action="store_true", help="write --out even when its name does not end in .png")
    p.set_defaults(run=_run_plot)


def _run_plot(args) -> int:
    from scratchlm.training.plot import plot_run

    print(plot_run(args.run_dir, args.out, force=args.force))
    return 0


def add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="what this machine gives scratchlm: CPU flags, bfloat16, kernels, measured speeds, fonts")
    p.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    p.add_argument("--no-measure", action="store_true", help="skip the timed probes (matmul rates, memory bandwidth)")
    p.set_defaults(run=_run_doctor)


def _run_doctor(args) -> int:
    from scratchlm.cli import doctor

    facts = doctor.facts(measure=not args.no_measure)
    print(json.dumps(facts) if args.json else "\n".join(doctor.report(facts)))
    return 0
