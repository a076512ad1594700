"""The `scratchlm` command: argparse subcommands that build configs and call library functions.

Each subcommand is an `_add_<name>` function (its flags) and a `_run_<name>` function (the call);
those that look inside a model or a run live in scratchlm.cli.look_inside.
A `UserError` becomes one `error: ...` line on stderr and exit status 2; `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from scratchlm.cli import chat as cli_chat
from scratchlm.cli import look_inside as cli_inside
from scratchlm.cli.flags import add_field_flags, add_generation_flags
from scratchlm.envflags import check_switches
from scratchlm.errors import UserError
from scratchlm.serve.cli import add_serve

MAX_PROMPT_CHARS = 1_000_000
"""The longest prompt read from a file or stdin (a context is a few thousand tokens)."""


def _add_paths_command(sub, name: str, help: str, run, *paths: tuple[str, str, str]) -> None:
    """A subcommand that takes only positional paths, each (dest, METAVAR, help)."""
    p = sub.add_parser(name, help=help)
    for dest, metavar, text in paths:
        p.add_argument(dest, metavar=metavar, help=text)
    p.set_defaults(run=run)


def _add_export_hf(sub) -> None:
    p = sub.add_parser("export-hf", help="write a checkpoint as a Hugging Face folder: GPT-2, GPT-NeoX or Llama "
                                         "(loads offline in transformers)")
    p.add_argument("checkpoint", metavar="CKPT", help="a run or checkpoint directory")
    p.add_argument("out_dir", metavar="OUT_DIR", help="directory to create (must not exist, or be empty)")
    p.add_argument("--lora", choices=["merged", "adapter"], default="merged",
                   help="a LoRA run: one model with the adapters merged in (default), or `adapter`: OUT_DIR/base and "
                        "OUT_DIR/adapter, a PEFT adapter that peft.PeftModel.from_pretrained puts on the base")
    p.set_defaults(run=_run_export_hf)


def _run_export_hf(args) -> int:
    import warnings
    from pathlib import Path

    from safetensors import SafetensorError

    from scratchlm.checkpoint import load_model, output_write_failed
    from scratchlm.hf.interop import export_hf

    apart = args.lora == "adapter"
    model, tokenizer, _ = load_model(args.checkpoint, merged=not apart)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if apart:
                from scratchlm.hf.peft_export import export_peft

                out = export_peft(model, args.out_dir, tokenizer)
            else:
                out = export_hf(model, args.out_dir, tokenizer)
        except (OSError, SafetensorError) as exc:  # a full disk: name OUT_DIR, not the temporary folder
            raise output_write_failed(Path(args.out_dir), "the Hugging Face folder", exc) from None
    for w in caught:
        print(f"note: {w.message}", file=sys.stderr)
    print(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


def _add_export_gguf(sub) -> None:
    p = sub.add_parser("export-gguf", help="write a checkpoint and its tokenizer as one GGUF file for llama.cpp "
                                          "(llama-completion, llama-server, llama-cpp-python, Ollama, LM Studio)")
    p.add_argument("checkpoint", metavar="CKPT", help="a run or checkpoint directory")
    p.add_argument("out", metavar="OUT", help="the .gguf file to write (an earlier export is replaced whole; any "
                                              "other file is refused)")
    p.add_argument("--dtype", choices=["f32", "f16", "bf16", "q8_0"], default="f32",
                   help="the matrices' number format: f32 (exact, the default), f16, bf16 or q8_0 (8-bit, about a "
                        "quarter of f32's size); norms and biases stay f32")
    p.add_argument("--all-q8_0", action="store_true",
                   help="with --dtype q8_0, quantize also the matrices that llama.cpp's AMX kernels would take (kept "
                        "f16 by default: they crash on Intel CPUs with AMX): a smaller file for other CPUs")
    p.add_argument("--force", action="store_true", help="write OUT even if its name does not end in .gguf")
    p.set_defaults(run=_run_export_gguf)


def _run_export_gguf(args) -> int:
    from pathlib import Path

    from scratchlm.errors import UserError, check_output_file
    from scratchlm.gguf.export import check_replaceable, export_gguf
    from scratchlm.outdir import check_not_input
    from scratchlm.checkpoint import load_model, output_write_failed

    check_output_file(args.out, ".gguf", "OUT", force=args.force)
    check_replaceable(args.out)
    if args.all_q8_0 and args.dtype != "q8_0":
        raise UserError(f"--all-q8_0 is for --dtype q8_0 (got --dtype {args.dtype})")
    model, tokenizer, info = load_model(args.checkpoint)
    ckpt = Path(info["checkpoint"])  # what was read: the checkpoint, its run's tokenizer and `latest`
    check_not_input(args.out, [ckpt, ckpt.parent / "tokenizer", ckpt.parent / "latest"], "OUT")
    name = Path(args.checkpoint).resolve().name
    try:
        done = export_gguf(model, tokenizer, Path(args.out).expanduser(), args.dtype, name=name,
                           all_q8_0=args.all_q8_0)
    except OSError as exc:  # a full disk: the old file (if any) is untouched and the partial one gone
        raise output_write_failed(Path(args.out), "the GGUF file", exc) from None
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {done.path}: llama.cpp {done.arch}, {args.dtype}, {done.n_vocab} tokens ({done.tokenizer} "
          f"tokenizer), context {done.context}, {done.nbytes / 1e6:.1f} MB")
    return 0


def _add_import_hf(sub) -> None:
    _add_paths_command(sub, "import-hf", "read a local Hugging Face GPT-2, GPT-NeoX or Llama folder into a scratchlm checkpoint",
                       _run_import_hf, ("hf_dir", "HF_DIR", "a directory saved by save_pretrained (config.json + weights)"),
                       ("out_ckpt", "OUT_CKPT", "checkpoint directory to create"))


def _run_import_hf(args) -> int:
    from pathlib import Path

    from scratchlm.checkpoint import save_model_checkpoint
    from scratchlm.hf.interop import import_hf_dir, import_hf_tokenizer

    model = import_hf_dir(args.hf_dir)
    tokenizer = import_hf_tokenizer(args.hf_dir)
    source = {"imported_from": str(Path(args.hf_dir).resolve())}
    out = save_model_checkpoint(model, tokenizer, args.out_ckpt, extra_config=source)
    kind = f"{tokenizer.kind} tokenizer" if tokenizer is not None else "no tokenizer (none recognised in HF_DIR)"
    print(f"wrote {out}: {model.num_params():,} parameters, {kind}")
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


_SFT_EPILOG = """\
The same loop as `train`, learning the replies of conversations: --data FILE.jsonl or .parquet with
rows {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]} or
{"prompt": ..., "completion": ...}; --init_from the run, checkpoint or Hugging Face folder to start
from. The chat template's tokens (and, for a char vocabulary, the conversations' new characters)
are added to its tokenizer, with new model rows. --train_on all learns every turn's text.

"""


def _add_train(sub) -> None:
    for name, preset, text, epilog in (
            ("train", "shakespeare-char", "train a model (default preset: shakespeare-char)", _TRAIN_EPILOG),
            ("sft", "sft", "fine-tune a trained model on conversations (supervised fine-tuning of the replies)",
             _SFT_EPILOG + _TRAIN_EPILOG)):
        _add_train_command(sub, name, preset, text, epilog)


def _add_train_command(sub, name: str, preset: str, text: str, epilog: str) -> None:
    from scratchlm.training.train_config import TRAIN_PRESETS, cli_fields

    p = sub.add_parser(name, help=text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=None, choices=list(TRAIN_PRESETS),
                   help=f"training preset (default: {preset}, unless --resume)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run in RUN_DIR from its latest checkpoint (its saved config, plus any flags given)")
    p.add_argument("--show-config", action="store_true", help="print the resolved config as JSON and exit")
    train_group = p.add_argument_group("training fields (TrainConfig)")
    model_group = p.add_argument_group("model fields (GPTConfig; vocab_size comes from the tokenizer)")
    fields = cli_fields()  # --max-steps works too: _Parser respells it
    add_field_flags(train_group, [f for f in fields if not f.model])
    add_field_flags(model_group, [f for f in fields if f.model])
    p.set_defaults(run=_run_train, default_preset=preset, command_stage="sft" if name == "sft" else None)


def _run_train(args) -> int:
    import json

    from scratchlm.training.train import config_from_preset, resume_config, train
    from scratchlm.training.train_config import PRETRAIN_ONLY

    given = vars(args)
    train_overrides = {k[len("train."):]: v for k, v in given.items() if k.startswith("train.")}
    model_overrides = {k[len("model."):]: v for k, v in given.items() if k.startswith("model.")}
    if args.resume:
        if model_overrides or args.preset or train_overrides.get("init_from"):
            raise UserError("--resume continues an existing model; drop --preset, --init_from and the model flags")
        cfg = resume_config(args.resume, **train_overrides)
        if args.command_stage and cfg.stage != args.command_stage:
            raise UserError(f"{args.resume} is a {cfg.stage} run: continue it with `scratchlm train --resume "
                            f"{args.resume}`, or fine-tune it with `scratchlm sft --init_from {args.resume}`")
    else:  # with --init_from, config_from_preset keeps the source's model (only its context may change)
        if args.command_stage:  # `scratchlm sft`: the stage whatever the preset
            train_overrides.setdefault("stage", args.command_stage)
        cfg = config_from_preset(args.preset or args.default_preset, **train_overrides, model_overrides=model_overrides)
    unused = [name for name in PRETRAIN_ONLY if name in train_overrides] if cfg.stage == "sft" else []
    if unused:
        raise UserError(f"--{unused[0]} is a pre-training setting: the sft stage takes the --init_from model's "
                        "tokenizer, batches whole conversations and evaluates every held-out one; drop it")
    if args.show_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    result = train(cfg)
    if result.stopped:
        return 130
    if not result.is_main:
        return 0
    print(f"continue a prompt with: scratchlm generate --checkpoint {result.run_dir}")
    return 0


def _add_prepare(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize text into train/val token shards (and a tokenizer)")
    p.add_argument("--data", nargs="+", default=["shakespeare"], metavar="SOURCE",
                   help="`shakespeare` or `tang` (built in; `tang-traditional` keeps the poems' characters), or "
                        ".txt/.jsonl/.parquet files and folders (default: shakespeare)")
    p.add_argument("--tokenizer", choices=["char", "bpe", "gpt2"], default="bpe", help="tokenizer kind (default: bpe)")
    p.add_argument("--vocab-size", type=int, default=None, help="bpe: vocabulary size to train (default: 8192)")
    p.add_argument("--tokenizer-file", default=None,
                   help="gpt2: a gpt2.tiktoken rank file (offline); bpe: a tokenizer.json; any: a saved tokenizer folder")
    p.add_argument("--out", default=None,
                   help="output folder: new, empty, or one prepare wrote before (default: the cache folder that "
                        "`train` looks in for the same settings)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share held out for validation (default: 0.1)")
    p.add_argument("--split", choices=["tail", "documents"], default="tail",
                   help="tail: last tokens are validation (default); documents: a seeded random set of documents")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with its position (default) or replace it with U+FFFD")
    p.add_argument("--seed", type=int, default=0, help="seed of the documents split (default: 0)")
    p.add_argument("--block-size", type=int, default=None, help="check that each split holds a window of this many + 1 tokens")
    p.add_argument("--char-unk", action="store_true", help="char: add an <unk> id for characters the text lacks")
    p.add_argument("--workers", type=int, default=None, help="threads that encode (default: one per core)")
    p.add_argument("--shard-tokens", type=int, default=None, help="token ids per shard file (default: 100,000,000)")
    p.set_defaults(run=_run_prepare)


def _run_prepare(args) -> int:
    from scratchlm.data import DataConfig, cache_dir, prepare, read_meta
    from scratchlm.data.config import MAX_PIECE_CHARS

    cfg = DataConfig(data=args.data, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                     tokenizer_file=args.tokenizer_file, val_fraction=args.val_fraction, split=args.split,
                     seed=args.seed, errors=args.errors, char_unk=args.char_unk, block_size=args.block_size)
    out = prepare(cfg, args.out if args.out else cache_dir(cfg), workers=args.workers, shard_tokens=args.shard_tokens)
    m = read_meta(out)
    sec = m["seconds"]
    mb = m["input_bytes"] / 1e6
    print(f"prepared {out}")
    print(f"  tokenizer   {m['tokenizer']}, vocab {m['vocab_size']:,} (bos {m['bos_id']}, eos {m['eos_id']}), shards {m['dtype']}")
    print(f"  input       {len(m['sources'])} file(s), {m['documents']:,} documents, {mb:.2f} MB of text")
    print(f"  train       {m['train_tokens']:,} tokens, {m['train_documents']:,} documents, {m['train_bytes']:,} bytes")
    print(f"  val         {m['val_tokens']:,} tokens, {m['val_documents']:,} documents, {m['val_bytes']:,} bytes ({m['split']} split)")
    print(f"  shards      {len(m['shards']['train'])} train + {len(m['shards']['val'])} val, up to {m['shard_tokens']:,} ids each; "
          + (f"tokenizer trained on {m['tokenizer_trained_on']}" if m["tokenizer_trained_on"] else "tokenizer loaded"))
    if m["forced_cuts"]:
        print(f"  warning     {m['forced_cuts']} piece(s) had no safe place to cut within {MAX_PIECE_CHARS:,} characters and were "
              "cut there anyway: the ids at those cuts may differ from encoding the document whole")
    print(f"  time        tokenizer {sec['tokenizer']:.2f} s, encoding {sec['encode']:.2f} s "
          f"({mb / max(sec['encode'], 1e-9):.1f} MB/s on {m['workers']} thread(s)), total {sec['total']:.2f} s ({mb / max(sec['total'], 1e-9):.1f} MB/s)")
    return 0


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained model, printing text as it comes")
    p.add_argument("--checkpoint", required=True, metavar="RUN_OR_CKPT_DIR",
                   help="a run directory (its latest checkpoint is used) or one checkpoint directory")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="text to continue; default: stdin when it is piped, else start from BOS")
    source.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a UTF-8 text file (used as is)")
    add_generation_flags(p)
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context every step (the plain loop)")
    p.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt before it")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "auto"], default=None,
                   help="decode with the weights cast to this (bfloat16: about twice as fast on CPU, half the "
                        "bytes to read per token, at bfloat16 precision; auto: bfloat16 where this machine reads "
                        "it fast, see `scratchlm doctor`; default: the checkpoint's own)")
    p.set_defaults(run=_run_generate)


def _read_prompt(args) -> str:
    from scratchlm.text.text_files import argument_text, stdin_text, without_bom  # one rule, every reader

    if args.prompt is not None:
        return argument_text(args.prompt, "--prompt")
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                text = f.read(MAX_PROMPT_CHARS + 1)  # bounded: /dev/zero or a huge file must not fill memory
            if len(text) > MAX_PROMPT_CHARS:
                raise UserError(f"--prompt-file {args.prompt_file}: longer than {MAX_PROMPT_CHARS:,} characters; a "
                                "prompt is cropped to the model's context anyway, so give its end only")
            return without_bom(text)
        except OSError as exc:
            raise UserError(f"--prompt-file {args.prompt_file}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise UserError(f"--prompt-file {args.prompt_file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if sys.stdin is not None and not sys.stdin.isatty():
        text = stdin_text(MAX_PROMPT_CHARS, "the prompt on stdin")
        if len(text) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt on stdin is longer than {MAX_PROMPT_CHARS:,} characters; give its end only")
        return text
    return ""  # nothing given: start from BOS


def ignored_generate_flags(args) -> str | None:
    """A warning naming the flags given that this generation cannot use, or None: the settings
    `inert_settings` names for its kind of decoding, the length penalty without beams, and an
    empty stop string (it matches nothing)."""
    from scratchlm.generation.settings import BEAM_ONLY, inert_settings, setting_given

    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    names, why = inert_settings(args.beams, args.greedy or args.temperature == 0, flag)
    flags = [flag(name) for name in names if setting_given(name, getattr(args, name), args.beams)]
    notes = [f"{', '.join(flags)} {'has' if len(flags) == 1 else 'have'} no effect {why}"] if flags else []
    beam_only = [flag(name) for name in BEAM_ONLY if setting_given(name, getattr(args, name), args.beams)]
    if args.beams == 1 and beam_only:
        notes.append(f"{', '.join(beam_only)} {'applies' if len(beam_only) == 1 else 'apply'} to beam search only")
    if "" in args.stop:
        notes.append("an empty --stop matches nothing and is left out")
    return "; ".join(notes) or None


def _run_generate(args) -> int:
    import os
    import warnings

    from scratchlm.checkpoint import load_model
    from scratchlm.machine.devices import pick_device
    from scratchlm.generation.engine import Engine
    from scratchlm.generation.sampling import MAX_NEW_TOKENS_LIMIT, check_length_penalty
    from scratchlm.generation.settings import GenerationSettings, generation_fields

    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise UserError(f"--max-new-tokens must be between 0 and {MAX_NEW_TOKENS_LIMIT}, got {args.max_new_tokens}")
    check_length_penalty(args.length_penalty)  # with or without --beams, as the playground does
    ignored = ignored_generate_flags(args)
    if ignored:
        print(f"warning: {ignored}", file=sys.stderr, flush=True)
    device = pick_device(args.device, allow_mps=False)  # decoding's fast paths are CPU and CUDA
    stops = [s.replace("\\n", "\n").replace("\\t", "\t") for s in args.stop]
    prompt = _read_prompt(args)
    model, tokenizer, info = load_model(args.checkpoint, device=device)
    if tokenizer is None:
        raise UserError(f"{info['checkpoint']}: no tokenizer saved with this checkpoint or its run; cannot turn text into ids")
    given = {f.name: getattr(args, f.name) for f in generation_fields()}  # the flags are the records' fields
    settings = GenerationSettings.of(**{**given, "stop": stops})
    engine = Engine(model, tokenizer, dtype=args.dtype, use_cache=not args.no_cache)
    out = sys.stdout
    try:
        with warnings.catch_warnings():
            # a cropped prompt is reported as one plain line on stderr, before any text
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, *rest, **kw: print(f"warning: {message}", file=sys.stderr, flush=True)
            if args.beams == 1 and args.num_samples == 1:
                pieces = engine.stream(prompt, settings)  # checks the prompt first
                if not args.no_echo:
                    out.write(prompt)
                    out.flush()
                for piece in pieces:
                    out.write(piece)
                    out.flush()
                out.write("\n")
                return 0
            result = engine.generate(prompt, settings)
        for i, text in enumerate(result.texts):
            header = f"--- sample {i + 1}/{len(result.texts)}"
            if result.logprobs is not None:
                header += f", logprob {result.logprobs[i]:.4f}"
            out.write(f"{header} ---\n{'' if args.no_echo else prompt}{text}\n")
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly, and keep Python's exit-time flush quiet too
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a bad flag reported as one `error: ...` line, like every other error (the
    usage text is one --help away), and every multi-word flag taken in both spellings:
    `--max-steps` and `--max_steps` (help shows the one each command declares). Subcommand
    parsers are made of this class too, so each respells its own flags."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self._respelled(args), namespace)

    def _respelled(self, args: list[str]) -> list[str]:
        """`args` with each flag this parser does not know, but knows with `-` and `_` swapped,
        written the way it knows it (`--max_steps=3` -> `--max-steps=3` where that is declared)."""
        known = self._option_string_actions
        by_key = {flag.replace("_", "-"): flag for flag in known if flag.startswith("--")}  # --no-fused_loss too
        out = []
        for i, arg in enumerate(args):
            if arg == "--":  # everything after it is a value
                return out + args[i:]
            name, eq, value = arg.partition("=")
            if name.startswith("--") and name not in known:
                name = by_key.get(name.replace("_", "-"), name)
            out.append(name + eq + value)
        return out


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="loss, perplexity and bits per byte of a text file under a checkpoint")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a run or checkpoint directory")
    p.add_argument("--data", required=True, metavar="FILE", help="a UTF-8 text file to score")
    p.add_argument("--stride", type=int, default=None,
                   help="ids between window starts (default: the context length: windows that do not overlap)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass (default: 8)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto (default: auto)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=_run_eval)


def _run_eval(args) -> int:
    from pathlib import Path

    from scratchlm.checkpoint import load_model
    from scratchlm.machine.devices import pick_device
    from scratchlm.training.scoring import score_text
    from scratchlm.text.text_files import without_bom

    if args.batch_size < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    path = Path(args.data)
    if not path.is_file():
        raise UserError(f"--data {path}: {'not a regular file' if path.exists() else 'no such file'}")
    try:
        text = without_bom(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"--data {path}: not UTF-8 text (a bad byte at offset {exc.start})") from None
    device = pick_device(args.device)
    model, tokenizer, info = load_model(args.checkpoint, device=device)
    if tokenizer is None:
        raise UserError(f"{info['checkpoint']}: no tokenizer saved with this checkpoint or its run; cannot read text")
    bar = None
    if not args.json and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(unit="window", desc="scoring", leave=False)

    def on_window(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        score = score_text(model, tokenizer, text, stride=args.stride, batch_size=args.batch_size, on_window=on_window)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps({"checkpoint": str(info["checkpoint"]), "data": str(path), **score.to_dict()}))
    else:
        print(f"{path}: loss {score.loss:.4f} nats/token, perplexity {score.perplexity:.2f}, "
              f"{score.bits_per_byte:.4f} bits/byte ({score.tokens:,} tokens, {score.bytes:,} bytes, "
              f"{score.windows:,} windows of up to {model.config.block_size}, stride {score.stride})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="scratchlm", description="A GPT built from scratch, every step visible.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    cli_inside.add_inspect(sub)
    _add_prepare(sub)
    _add_train(sub)
    cli_inside.add_plot(sub)
    cli_inside.add_walkthrough(sub)
    cli_inside.add_tokenize(sub)
    cli_inside.add_attention(sub)
    _add_export_hf(sub)
    _add_export_gguf(sub)
    _add_import_hf(sub)
    _add_generate(sub)
    cli_chat.add_chat(sub)
    _add_eval(sub)
    cli_inside.add_doctor(sub)
    add_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_switches()  # SCRATCHLM_NO_KERNELS=no and the like: refused before any work
        return int(args.run(args) or 0)
    except UserError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly, and keep Python's exit-time flush quiet too
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        # the file system said no (a full disk, no permission, a file where a folder should be):
        # a problem of the machine or the paths given, not a bug, so one line too
        if args.debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}; check the paths given, their permissions and the free disk space "
              "(--debug shows where it happened)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
