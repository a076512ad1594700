"""Text to token shards: read documents, tokenize, split, write (scratchlm.data.shards' format).

prepare(cfg, out_dir) turns text into

    out_dir/train-00000.bin, ...     token shards (header + uint16/uint32 ids) of at most
    out_dir/val-00000.bin, ...       shard_tokens ids each; train and val are one stream cut in two
    out_dir/tokenizer/               the tokenizer, loadable with load_tokenizer
    out_dir/meta.json                sources, tokenizer, shards, token counts, split (written last)

Every document becomes BOS followed by its tokens; documents are concatenated into one stream.
By default the last `val_fraction` of that stream is validation (nanoGPT's split, so figures
compare); `split="documents"` sends a seeded random set of whole documents to validation instead.

It streams, in four stages, so memory does not grow with the corpus: the tokenizer is trained
(or loaded), on the whole input for `char` and on a bounded sample for `bpe`; the input is read
in bounded pieces (scratchlm.data.reading), cut where the tokenizer allows (scratchlm.data.cutting),
encoded on a pool of threads (scratchlm.data.encoding) and appended to shards as it goes; then
the stream is split (scratchlm.data.writing).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from scratchlm.data.config import BPE_SAMPLE_BYTES, BUILT_IN, DEFAULT_BPE_VOCAB, DEFAULT_SHARD_TOKENS, DataConfig
from scratchlm.data.cutting import Cutter
from scratchlm.data.encoding import Stream, default_workers, encode_to_parts
from scratchlm.data.reading import Source, iter_pieces, resolve_sources, source_pieces
from scratchlm.data.shards import FORMAT_VERSION, read_meta, read_split, shard_dtype
from scratchlm.data.writing import ShardWriter, read_positions, split_documents, split_tail
from scratchlm.errors import ConfigError, UserError, check_folder_path
from scratchlm.fileio import cache_home, file_record, out_of_room, why_write_failed


# ----------------------------------------------------------------------------------------------
# stage 2: the tokenizer


class _Sample:
    """The texts BPE trains on: at most `budget` UTF-8 bytes in all, each file giving the front
    of its share (by size) when the input is larger. `cut` is set once a file's share ran out
    before its text did."""

    def __init__(self, sources: list[Source], errors: str, budget: int):
        self.sources, self.errors, self.budget, self.cut = sources, errors, budget, False
        self.total = sum(s.path.stat().st_size for s in sources)

    def __iter__(self) -> Iterator[str]:
        cutter, left = Cutter("gpt2"), self.budget
        for source in self.sources:
            share = left if self.total <= self.budget else self.budget * source.path.stat().st_size // self.total
            share = min(share, left)
            for piece, _ in source_pieces(source, self.errors, cutter):
                data = piece.text.encode("utf-8")
                if len(data) > share:
                    self.cut = True
                    data = data[:share]
                share -= len(data)
                left -= len(data)
                if data:
                    yield data.decode("utf-8", "ignore")  # a character cut in two at the end is dropped
                if share <= 0:
                    break

    def said(self) -> str:
        if not self.cut:
            return "the whole input"
        return (f"a sample: the first {self.budget / 1e6:.0f} MB of the input's {self.total / 1e6:.0f} MB, "
                "each file giving its share")


def _build_tokenizer(cfg: DataConfig, sources: list[Source]):
    """(tokenizer, what it was trained on, None for a loaded one): char reads every character of
    the input (streamed); bpe trains on a bounded sample (_Sample); gpt2 and a tokenizer file
    are loaded."""
    from scratchlm.text.tokenizer import get_tokenizer, train_tokenizer

    if cfg.tokenizer_file is not None or cfg.tokenizer == "gpt2":
        return get_tokenizer(cfg.tokenizer, tokenizer_file=cfg.tokenizer_file), None
    sample = _Sample(sources, cfg.errors, BPE_SAMPLE_BYTES) if cfg.tokenizer == "bpe" else None
    texts = iter(sample if sample is not None else (p.text for p, _ in iter_pieces(sources, cfg.errors, Cutter("anywhere"))))
    first = next(texts, None)
    if first is None:
        raise UserError(f"no text found in {', '.join(cfg.paths)}: every input document is empty")
    vocab = (cfg.vocab_size or DEFAULT_BPE_VOCAB) if cfg.tokenizer == "bpe" else None
    tok = train_tokenizer(cfg.tokenizer, _chain(first, texts), vocab, unk=cfg.char_unk)
    what = sample.said() if sample is not None else "the whole input"
    if sample is not None and sample.cut:
        print(f"trained the bpe tokenizer on {what}", file=sys.stderr)
    return tok, what


def _chain(first, rest):
    yield first
    yield from rest


# ----------------------------------------------------------------------------------------------
# stage 3 and 4: encode, split


def _progress(total: int, enabled: bool | None):
    from tqdm import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="encoding", disable=not enabled,
                leave=False, smoothing=0.1)


def _source_records(sources: list[Source]) -> list[dict]:
    return [file_record(s.path) for s in sources]


def _check_window(cfg: DataConfig, name: str, count: int) -> None:
    need = (cfg.block_size or 1) + 1
    if count < need:
        what = f"one window of block_size + 1 = {need} tokens" if cfg.block_size else "2 tokens (an input and its target)"
        raise UserError(
            f"the {name} split holds {count} tokens, fewer than {what}; use more text"
            + (", a smaller block size" if cfg.block_size else "")
            + (" or a different --val-fraction" if cfg.val_fraction > 0 else "")
        )


def _split(cfg: DataConfig, stream: Stream, staging: Path, dtype: np.dtype, lengths: np.ndarray, shard_tokens: int):
    """Stage 4: ({"train": shards, "val": shards}, train documents, val documents)."""
    n, n_docs = stream.tokens, stream.documents
    if cfg.split == "tail":
        n_train = int(n * (1 - cfg.val_fraction))  # nanoGPT's int(n * 0.9)
        docs_train = sum(int((block < n_train).sum()) for block in read_positions(stream.positions))
        train, val = split_tail(stream.parts, n_train, staging, dtype, lengths)
        return {"train": train, "val": val}, docs_train, n_docs - docs_train
    n_val = max(1, round(n_docs * cfg.val_fraction)) if cfg.val_fraction > 0 else 0
    if n_val >= n_docs:
        raise UserError(
            f"the documents split would send all {n_docs} document(s) to validation (--val-fraction "
            f"{cfg.val_fraction}); use more documents, a smaller --val-fraction, or --split tail"
        )
    is_val = np.zeros(n_docs, dtype=bool)
    is_val[np.random.default_rng(cfg.seed).permutation(n_docs)[:n_val]] = True
    writers = tuple(ShardWriter(staging, name, dtype, shard_tokens, lengths) for name in ("train", "val"))
    try:
        split_documents(stream.parts, is_val, staging, stream.positions, writers)
        return {"train": writers[0].close(), "val": writers[1].close()}, n_docs - n_val, n_val
    finally:
        for w in writers:
            w.abandon()


def _build(cfg: DataConfig, staging: Path, progress: bool | None, workers: int, shard_tokens: int) -> dict:
    """Everything prepare writes, into the empty folder `staging`, in stages: read the documents,
    train (or load) the tokenizer, encode, split and write; returns the meta dict."""
    t_start = time.perf_counter()
    sources = resolve_sources(cfg)
    total_input = sum(s.path.stat().st_size for s in sources)
    tok, trained_on = _build_tokenizer(cfg, sources)  # stage 2
    t_tokenizer = time.perf_counter()
    dtype, lengths = shard_dtype(tok.vocab_size), tok.token_byte_lengths()
    cutter = Cutter(tok.cut_rule)
    with _progress(total_input, progress) as bar:
        stream = encode_to_parts(tok, iter_pieces(sources, cfg.errors, cutter),
                                 ShardWriter(staging, "part", dtype, shard_tokens, lengths),
                                 staging / "documents.u64", workers, bar)
    if stream.documents == 0:
        raise UserError(f"no text found in {', '.join(cfg.paths)}: every input document is empty")
    t_encode = time.perf_counter()
    shards, docs_train, docs_val = _split(cfg, stream, staging, dtype, lengths, shard_tokens)
    stream.positions.unlink()
    counts = {name: sum(s.tokens for s in shards[name]) for name in ("train", "val")}
    _check_window(cfg, "train", counts["train"])
    if cfg.val_fraction > 0:
        _check_window(cfg, "validation", counts["val"])
    tok.save(staging / "tokenizer")
    t_end = time.perf_counter()
    return {
        "format_version": FORMAT_VERSION, "tokenizer": tok.kind, "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id, "eos_id": tok.eos_id, "dtype": dtype.name, "split": cfg.split,
        "val_fraction": cfg.val_fraction, "seed": cfg.seed, "documents": stream.documents,
        "train_documents": docs_train, "val_documents": docs_val,
        "train_tokens": counts["train"], "val_tokens": counts["val"],
        "train_bytes": sum(s.bytes for s in shards["train"]), "val_bytes": sum(s.bytes for s in shards["val"]),
        "input_bytes": stream.text_bytes, "sources": _source_records(sources), "config": cfg.to_dict(),
        "shards": {name: [{"file": s.name, "tokens": s.tokens} for s in shards[name]] for name in ("train", "val")},
        "shard_tokens": shard_tokens, "workers": workers, "tokenizer_trained_on": trained_on,
        "forced_cuts": cutter.forced,
        "seconds": {
            "tokenizer": round(t_tokenizer - t_start, 3),
            "encode": round(t_encode - t_tokenizer, 3),
            "total": round(t_end - t_start, 3),
        },
    }


PREPARE = "scratchlm prepare"
"""The command named in the marker of a folder prepare wrote (scratchlm.outdir)."""
OUTPUT_NAMES = ("train.bin", "val.bin", "meta.json", "tokenizer")
"""What prepare writes besides its shards (train.bin and val.bin: the one-file layout before shards)."""
SHARD_NAME = re.compile(r"(train|val)-[0-9]{5}\.bin")
STAGING_PREFIX = ".staging-"


def _is_own_name(name: str) -> bool:
    return name in OUTPUT_NAMES or bool(SHARD_NAME.fullmatch(name)) or name.startswith(STAGING_PREFIX)


@dataclass(frozen=True)
class PrepareOptions:
    """How prepare works, not what it makes: the same data comes out whatever these are."""

    progress: bool | None = None
    """Show a progress bar (None: when stderr is a terminal)."""
    workers: int | None = None
    """Threads that encode (None: one per core)."""
    shard_tokens: int | None = None
    """Ids per shard file (None: DEFAULT_SHARD_TOKENS)."""

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ConfigError("workers", f"must be at least 1, got {self.workers}")
        if self.shard_tokens is not None and self.shard_tokens < 1:
            raise ConfigError("shard_tokens", f"must be at least 1, got {self.shard_tokens}")


def prepare(cfg: DataConfig, out_dir: str | os.PathLike, *, progress: bool | None = None, workers: int | None = None,
            shard_tokens: int | None = None) -> Path:
    """Tokenize the configured text into out_dir (train-*.bin, val-*.bin, meta.json, tokenizer/).

    out_dir must be new, empty, or a folder prepare wrote before (scratchlm.outdir: its marker,
    or a complete output from before markers), and hold none of the input; one prepare at a time
    writes it (its lock). Everything is built in a hidden staging folder inside out_dir first, so
    a failure (bad input, a full disk, an interrupt) leaves out_dir exactly as it was. Publishing
    renames the new files in, with meta.json removed first and written last: a folder with a
    meta.json is complete. `progress`: show a progress bar (None: when stderr is a terminal);
    `workers`: encoding threads (None: one per core); `shard_tokens`: ids per shard file (None:
    DEFAULT_SHARD_TOKENS)."""
    options = PrepareOptions(progress, workers, shard_tokens)
    return _prepare_into(cfg, Path(out_dir).expanduser(), options, cache=False)


def _prepare_into(cfg: DataConfig, out_dir: Path, options: PrepareOptions, *, cache: bool) -> Path:
    """prepare(); `cache`: out_dir is a folder of scratchlm's own data cache (ensure_prepared,
    for `train`): wait for another prepare of it to end (and then take its output when it is
    complete) instead of refusing; take a folder that holds only names prepare writes as a
    leftover of its own (an older version's, or a kill's) and build it again; and name
    --data_cache, train's flag for it, in the refusals."""
    from scratchlm.outdir import claim_folder, mark

    flag = "--data_cache" if cache else "--out"
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a folder; choose another {flag}")
    check_folder_path(out_dir, flag)
    inputs = [s.path for s in resolve_sources(cfg)] if cfg.data not in BUILT_IN else []
    if cfg.tokenizer_file is not None:
        inputs.append(Path(cfg.tokenizer_file))
    legacy = (lambda folder: True) if cache else is_prepared
    lock = claim_folder(out_dir, PREPARE, flag, own=_is_own_name, inputs=inputs, legacy=legacy,
                        doing="preparing data into this folder", wait=cache)
    try:
        if cache and is_prepared(out_dir):
            return out_dir  # the other writer made it while this one waited
        for stale in out_dir.glob(STAGING_PREFIX + "*"):  # a prepare killed here before: its leftovers
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
        try:
            meta = _build_or_say_why(cfg, staging, out_dir, options, flag)
            mark(out_dir, PREPARE)  # before publishing: a kill part-way leaves a folder a rerun knows as its own
            _publish(staging, out_dir, meta)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        lock.release()
    return out_dir


def _build_or_say_why(cfg: DataConfig, staging: Path, out_dir: Path, options: PrepareOptions, flag: str) -> dict:
    """_build, with a write that fails for lack of space said in one line that names out_dir
    (not the staging file numpy was writing) and that nothing in it changed."""
    try:
        meta = _build(cfg, staging, options.progress, options.workers or default_workers(),
                      options.shard_tokens or DEFAULT_SHARD_TOKENS)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return meta
    except OSError as exc:
        if not out_of_room(exc):
            raise
        raise UserError(f"{out_dir}: no room to write the prepared data: {why_write_failed(exc)}; nothing in {out_dir} "
                        "was changed and the partial files were removed. Free some space, or choose another "
                        f"{flag}") from None


def _publish(staging: Path, out_dir: Path, meta: dict) -> None:
    """Move the staged output into out_dir (the same file system, so each step is a rename):
    meta.json goes first, then every shard an earlier prepare left, then the new shards and the
    tokenizer come in, and meta.json last."""
    old_meta = out_dir / "meta.json"
    if old_meta.exists():
        old_meta.unlink()  # from here until the new meta.json lands, the folder reads as incomplete
    for old in out_dir.iterdir():
        if old.name in ("train.bin", "val.bin") or SHARD_NAME.fullmatch(old.name):
            old.unlink()
    old_tok = out_dir / "tokenizer"
    if old_tok.exists():
        os.rename(old_tok, staging / "tokenizer-old")  # removed with the staging folder
    os.rename(staging / "tokenizer", old_tok)
    for split in ("train", "val"):
        for shard in meta["shards"][split]:
            os.replace(staging / shard["file"], out_dir / shard["file"])
    os.replace(staging / "meta.json", out_dir / "meta.json")


# ----------------------------------------------------------------------------------------------
# cache


def cache_root() -> Path:
    """Where ensure_prepared keeps prepared data by default: the data/ folder of `cache_home()`."""
    return cache_home() / "data"


def _file_stamp(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def cache_dir(cfg: DataConfig, root: str | os.PathLike | None = None) -> Path:
    """The folder ensure_prepared uses for cfg: named by a hash of what decides the output
    (the fields that change it, and every source file's path, size and modification time)."""
    keyed = {k: v for k, v in cfg.to_dict().items() if k not in ("data", "tokenizer_file", "block_size")}
    stamp: dict = {"format": FORMAT_VERSION, "config": keyed, "sources": [_file_stamp(s.path) for s in resolve_sources(cfg)]}
    if cfg.tokenizer_file is not None:
        tf = Path(cfg.tokenizer_file).expanduser()
        files = sorted(p for p in tf.rglob("*") if p.is_file()) if tf.is_dir() else [tf]
        if not all(p.exists() for p in files):
            raise UserError(f"{tf}: no such tokenizer file")
        stamp["tokenizer_file"] = [_file_stamp(p) for p in files]
    digest = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]
    label = cfg.data if cfg.data in BUILT_IN else Path(cfg.paths[0]).stem or "data"
    return Path(root if root is not None else cache_root()).expanduser() / f"{label}-{cfg.tokenizer}-{digest}"


def is_prepared(directory: str | os.PathLike) -> bool:
    """True if directory holds a complete prepare output whose shards match its meta.json."""
    directory = Path(directory)
    try:
        meta = read_meta(directory)
        if meta.get("format_version") != FORMAT_VERSION or not (directory / "tokenizer").is_dir():
            return False
        return all(len(read_split(directory, split, meta)) == meta[f"{split}_tokens"] for split in ("train", "val"))
    except (UserError, KeyError, TypeError):
        return False


def ensure_prepared(cfg: DataConfig, cache_root: str | os.PathLike | None = None, *, progress: bool | None = None) -> Path:
    """A prepared folder for cfg: reused from the cache when its inputs are unchanged, else made.
    Under DDP call it on one rank and let the others wait (a barrier), then call it everywhere."""
    directory = cache_dir(cfg, cache_root)
    if not is_prepared(directory):  # made here, or by another process that holds it now (then waited for)
        _prepare_into(cfg, directory, PrepareOptions(progress=progress), cache=True)
    meta = read_meta(directory)
    _check_window(cfg, "train", meta["train_tokens"])
    if cfg.val_fraction > 0:
        _check_window(cfg, "validation", meta["val_tokens"])
    return directory
