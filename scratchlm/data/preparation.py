"""Text to token shards: read documents, tokenize, split, write (scratchlm.data.shards' format).

prepare(cfg, out_dir) turns text into

    out_dir/train.bin, out_dir/val.bin   token shards (header + uint16/uint32 ids)
    out_dir/tokenizer/                   the tokenizer, loadable with load_tokenizer
    out_dir/meta.json                    sources, tokenizer, token counts, split (written last)

Every document becomes BOS followed by its tokens; documents are concatenated into one stream.
By default the last `val_fraction` of that stream is validation (nanoGPT's split, so figures
compare); `split="documents"` sends a seeded random set of whole documents to validation instead.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from scratchlm.errors import ConfigError, UserError, check_folder_path
from scratchlm.fileio import atomic_write, cache_home, out_of_room, why_write_failed
from scratchlm.text.text_files import without_bom

from scratchlm.data.shards import FORMAT_VERSION, HEADER, MAGIC, read_meta, read_shard, shard_dtype

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
SPLITS = ("tail", "documents")
ERRORS = ("strict", "replace")
DEFAULT_BPE_VOCAB = 8192
IN_MEMORY_BYTES = 256 << 20  # inputs up to this size are read once and kept for both passes
CHUNK_CHARS = 1 << 20  # long documents are cut into pieces of about this size for parallel encoding



@dataclass
class DataConfig:
    """Where the text comes from and how it becomes token shards. Saved inside every checkpoint."""

    data: str | list[str] = "shakespeare"
    """`shakespeare` (the built-in corpus), or one or more paths: .txt files (one document each),
    .jsonl (one document per line, field `text`), .parquet (one per row, column `text`), or folders
    of them (read recursively, in sorted order)."""
    tokenizer: str = "bpe"
    """`char`, `bpe` (trained on the data) or `gpt2` (GPT-2's fixed 50257-token BPE)."""
    vocab_size: int | None = None
    """Vocabulary size to train `bpe` to (None: 8192). char and gpt2 fix their own size."""
    tokenizer_file: str | None = None
    """gpt2: a `gpt2.tiktoken` rank file (the offline path). bpe: a tokenizer.json to use instead
    of training. Any kind: a tokenizer directory saved by scratchlm."""
    val_fraction: float = 0.1
    """Share of the tokens (tail split) or of the documents (documents split) held out."""
    split: str = "tail"
    """`tail`: the last val_fraction of the token stream; `documents`: a seeded random set of documents."""
    seed: int = 0
    """Seed of the documents split."""
    errors: str = "strict"
    """Invalid UTF-8 in the input: `strict` stops with the file and byte offset, `replace` uses U+FFFD."""
    char_unk: bool = False
    """char only: add an `<unk>` id for characters the training text lacked (else they are an error)."""
    block_size: int | None = None
    """If set, each non-empty split must hold at least one window of block_size + 1 tokens.
    A check only: it does not change what is written."""

    def __post_init__(self) -> None:
        if isinstance(self.data, (list, tuple)):
            self.data = [str(p) for p in self.data]
            if len(self.data) == 1:
                self.data = self.data[0]
        elif isinstance(self.data, os.PathLike):
            self.data = os.fspath(self.data)
        if self.tokenizer_file is not None:
            self.tokenizer_file = os.fspath(self.tokenizer_file)
        self.validate()

    def validate(self) -> None:
        from scratchlm.text.tokenizer import KINDS

        if not self.data:
            raise ConfigError("data", "give `shakespeare` or at least one path")
        if self.tokenizer not in KINDS:
            raise ConfigError("tokenizer", f"{self.tokenizer!r} is not one of {', '.join(KINDS)}")
        if self.vocab_size is not None:
            if self.tokenizer != "bpe":
                raise ConfigError("vocab_size", f"only bpe is trained to a chosen size; {self.tokenizer}'s vocabulary is fixed by "
                                  + ("the input's characters" if self.tokenizer == "char" else "GPT-2 (50257)"))
            if self.vocab_size <= 0:
                raise ConfigError("vocab_size", f"must be positive, got {self.vocab_size}")
            if self.tokenizer_file is not None:
                raise ConfigError("vocab_size", "a loaded tokenizer (tokenizer_file) has its own size; give one or the other")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError("val_fraction", f"must be in [0, 1), got {self.val_fraction}")
        if self.split not in SPLITS:
            raise ConfigError("split", f"{self.split!r} is not one of {', '.join(SPLITS)}")
        if self.errors not in ERRORS:
            raise ConfigError("errors", f"{self.errors!r} is not one of {', '.join(ERRORS)}")
        if self.char_unk and self.tokenizer != "char":
            raise ConfigError("char_unk", "only the char tokenizer has an <unk> id")
        if self.block_size is not None and self.block_size <= 0:
            raise ConfigError("block_size", f"must be positive, got {self.block_size}")

    @property
    def paths(self) -> list[str]:
        return [self.data] if isinstance(self.data, str) else list(self.data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DataConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ----------------------------------------------------------------------------------------------
# reading documents


@dataclass
class _Source:
    path: Path
    kind: str  # "txt", "jsonl", "parquet" or "play" (a built-in Markdown play)


def _resolve_sources(cfg: DataConfig) -> list[_Source]:
    if cfg.data == "shakespeare":
        from scratchlm.text.corpus import shakespeare_files

        return [_Source(p, "play") for p in shakespeare_files()]
    sources: list[_Source] = []
    for name in cfg.paths:
        path = Path(name).expanduser()
        if path.is_dir():
            found = sorted(
                (p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()
                 and not any(part.startswith(".") for part in p.relative_to(path).parts)),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not found:
                raise UserError(f"{path}: folder holds no .txt, .jsonl or .parquet files")
            sources.extend(_Source(p, p.suffix[1:]) for p in found)
        elif path.is_file():
            kind = path.suffix[1:] if path.suffix in (".jsonl", ".parquet") else "txt"
            sources.append(_Source(path, kind))
        elif path.exists():  # /dev/null, a FIFO, a socket: no size to hash, or a read that may never end
            raise UserError(f"{path}: not a regular file or folder; give a text, .jsonl or .parquet file (or a folder of them)")
        else:
            raise UserError(f"{path}: no such file or folder")
    return sources


def _decode(data: bytes, errors: str, where: str, offset: int = 0) -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{where}: invalid UTF-8 at byte offset {offset + exc.start}; fix the file or pass --errors replace"
        ) from None


def _read_documents(source: _Source, errors: str) -> Iterator[str]:
    """The documents of one source file, in order."""
    path = source.path
    if source.kind in ("txt", "play"):
        text = without_bom(_decode(path.read_bytes(), errors, str(path)))
        if source.kind == "play":
            from scratchlm.text.corpus import markdown_play_to_text

            text = markdown_play_to_text(text)
        yield text
    elif source.kind == "jsonl":
        offset = 0
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                line = _decode(raw, errors, f"{path} line {lineno}", start)
                line = without_bom(line) if lineno == 1 else line
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise UserError(f"{path} line {lineno}: not valid JSON ({exc.args[0]})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise UserError(f"{path} line {lineno}: expected a JSON object with a string field \"text\"")
                yield record["text"]
    elif source.kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{path}: not a readable parquet file ({exc})") from None
        names = pf.schema_arrow.names
        if "text" not in names:
            raise UserError(f"{path}: parquet file has no \"text\" column (columns: {', '.join(names) or 'none'})")
        column_type = pf.schema_arrow.field("text").type
        if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
            raise UserError(f"{path}: parquet column \"text\" holds {column_type}, not strings")
        for group in range(pf.num_row_groups):  # one row group in memory at a time
            for value in pf.read_row_group(group, columns=["text"]).column("text").to_pylist():
                if value is not None:
                    yield value
    else:  # pragma: no cover - _resolve_sources only makes the kinds above
        raise AssertionError(source.kind)


def iter_documents(cfg: DataConfig) -> Iterator[str]:
    """Every non-empty document of the configured input, in a fixed order."""
    for source in _resolve_sources(cfg):
        for doc in _read_documents(source, cfg.errors):
            if doc:
                yield doc


def split_for_encoding(text: str, target: int = CHUNK_CHARS) -> list[str]:
    """Cut a long text into pieces of about `target` characters that encode to exactly the
    tokens of the whole text, so one big document still spreads over all cores.

    Cuts fall after a newline with a non-space character on each side. GPT-2's pre-tokenizer
    regex (used by bpe and gpt2) only joins a newline with other whitespace, so no pre-token
    spans such a cut, and BPE never merges across pre-tokens. Whitespace before the newline would
    not do: at the end of a piece, "\n\n" (or "\r\n") is one pre-token, while in the whole text,
    followed by a letter, it splits in two (the regex leaves a run's last space to what follows)."""
    if len(text) <= target:
        return [text]
    pieces, start = [], 0
    while len(text) - start > target:
        cut = text.find("\n", start + target)
        while cut != -1 and cut + 1 < len(text) and (text[cut + 1].isspace() or text[cut - 1].isspace()):
            cut = text.find("\n", cut + 1)
        if cut == -1 or cut + 1 >= len(text):
            break
        pieces.append(text[start : cut + 1])
        start = cut + 1
    pieces.append(text[start:])
    return pieces


# ----------------------------------------------------------------------------------------------
# prepare


def _build_tokenizer(cfg: DataConfig, documents: Iterable[str]):
    from scratchlm.text.tokenizer import get_tokenizer, train_tokenizer

    if cfg.tokenizer_file is not None or cfg.tokenizer == "gpt2":
        return get_tokenizer(cfg.tokenizer, tokenizer_file=cfg.tokenizer_file)
    pieces = (piece for doc in documents for piece in split_for_encoding(doc))
    vocab = (cfg.vocab_size or DEFAULT_BPE_VOCAB) if cfg.tokenizer == "bpe" else None
    return train_tokenizer(cfg.tokenizer, pieces, vocab, unk=cfg.char_unk)


def _encode_pieces(tok, pieces: list[str], dtype: np.dtype) -> list[np.ndarray]:
    if tok.kind == "char":
        return [tok.encode_array(p).astype(dtype) for p in pieces]
    return [np.array(ids, dtype=dtype) for ids in tok.encode_batch(pieces)]


def _progress(total: int, enabled: bool | None):
    from tqdm import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="encoding", disable=not enabled, leave=False)


def _source_records(sources: list[_Source]) -> list[dict]:
    records = []
    for s in sources:
        digest = hashlib.sha256()
        with open(s.path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        records.append({"path": str(s.path.resolve()), "bytes": s.path.stat().st_size, "sha256": digest.hexdigest()})
    return records


def _count_bytes(tokens: np.ndarray, lengths: np.ndarray) -> int:
    total = 0
    for i in range(0, len(tokens), 1 << 24):
        total += int(lengths[tokens[i : i + (1 << 24)]].sum())
    return total


def _copy_tokens(all_tokens: np.ndarray, ranges: Iterable[tuple[int, int]], path: Path, dtype: np.dtype) -> int:
    """Write the concatenation of all_tokens[a:b] over ranges as one shard; returns its length."""
    ranges = list(ranges)
    count = sum(b - a for a, b in ranges)
    with atomic_write(path) as f:
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, dtype.itemsize, count))
        for a, b in ranges:
            for i in range(a, b, 1 << 24):
                np.asarray(all_tokens[i : min(b, i + (1 << 24))]).tofile(f)
    return count


def _check_window(cfg: DataConfig, name: str, count: int) -> None:
    need = (cfg.block_size or 1) + 1
    if count < need:
        what = f"one window of block_size + 1 = {need} tokens" if cfg.block_size else "2 tokens (an input and its target)"
        raise UserError(
            f"the {name} split holds {count} tokens, fewer than {what}; use more text"
            + (", a smaller block size" if cfg.block_size else "")
            + (" or a different --val-fraction" if cfg.val_fraction > 0 else "")
        )


def _split_ranges(cfg: DataConfig, doc_lengths: list[int]):
    """(train ranges, val ranges, train documents, val documents) over the concatenated stream,
    where document i covers [starts[i], starts[i+1]) and a document's count goes to the split
    holding its BOS."""
    starts = np.concatenate([[0], np.cumsum(doc_lengths)]).astype(np.int64)
    n, n_docs = int(starts[-1]), len(doc_lengths)
    if cfg.split == "tail":
        n_train = int(n * (1 - cfg.val_fraction))  # nanoGPT's int(n * 0.9)
        docs_train = int((starts[:-1] < n_train).sum())
        return [(0, n_train)], [(n_train, n)], docs_train, n_docs - docs_train
    n_val = max(1, round(n_docs * cfg.val_fraction)) if cfg.val_fraction > 0 else 0
    if n_val >= n_docs:
        raise UserError(
            f"the documents split would send all {n_docs} document(s) to validation (--val-fraction "
            f"{cfg.val_fraction}); use more documents, a smaller --val-fraction, or --split tail"
        )
    is_val = np.zeros(n_docs, dtype=bool)
    is_val[np.random.default_rng(cfg.seed).permutation(n_docs)[:n_val]] = True
    ranges = [(int(starts[i]), int(starts[i + 1])) for i in range(n_docs)]
    train = [r for r, v in zip(ranges, is_val) if not v]
    val = [r for r, v in zip(ranges, is_val) if v]
    return train, val, n_docs - n_val, n_val


def _document_reader(cfg: DataConfig, sources: list[_Source], total_input: int):
    """Stage 1: a function that yields (source, document) for every non-empty document, each time
    it is called; the text is parsed once and kept when it fits in memory (training the
    tokenizer and encoding both read it)."""

    def documents() -> Iterator[tuple[_Source, str]]:
        for source in sources:
            for doc in _read_documents(source, cfg.errors):
                if doc:
                    yield source, doc

    if total_input <= IN_MEMORY_BYTES and cfg.tokenizer_file is None and cfg.tokenizer != "gpt2":
        cached = list(documents())
        return lambda: iter(cached)
    return documents


def _encode_all(tok, documents, total_input: int, all_path: Path, progress: bool | None) -> tuple[list[int], int]:
    """Stage 3: every document as BOS + its ids, one after another in `all_path`, encoded in
    parallel batches of pieces. Returns the tokens per document (BOS included) and the input's
    UTF-8 bytes."""
    dtype = shard_dtype(tok.vocab_size)
    bos = np.array([tok.bos_id], dtype=dtype)
    doc_lengths: list[int] = []
    input_bytes = 0

    def flush(batch: list[list[str]], out) -> None:
        """Encode the pieces of several documents in one parallel call, then write each document."""
        flat = [p for pieces in batch for p in pieces]
        encoded = iter(_encode_pieces(tok, flat, dtype))
        for pieces in batch:
            doc = np.concatenate([bos] + [next(encoded) for _ in pieces])
            doc.tofile(out)
            doc_lengths.append(len(doc))

    with open(all_path, "wb") as out, _progress(total_input, progress) as bar:
        batch: list[list[str]] = []
        batch_chars = 0
        previous: _Source | None = None
        for source, doc in documents():
            if source is not previous and previous is not None:
                bar.update(previous.path.stat().st_size)
            previous = source
            input_bytes += len(doc.encode("utf-8"))
            batch.append(split_for_encoding(doc))
            batch_chars += len(doc)
            if batch_chars >= 4 * CHUNK_CHARS:
                flush(batch, out)
                batch, batch_chars = [], 0
        flush(batch, out)
        bar.update(bar.total - bar.n)
    return doc_lengths, input_bytes


def _split_and_write(cfg: DataConfig, tok, all_path: Path, doc_lengths: list[int], staging: Path) -> dict:
    """Stage 4: the stream split into train.bin and val.bin (and the tokenizer saved) in
    `staging`; returns the split's counts for meta.json."""
    dtype = shard_dtype(tok.vocab_size)
    all_tokens = np.memmap(all_path, dtype=dtype, mode="r")
    train_ranges, val_ranges, docs_train, docs_val = _split_ranges(cfg, doc_lengths)
    n_train = sum(b - a for a, b in train_ranges)
    n_val = sum(b - a for a, b in val_ranges)
    _check_window(cfg, "train", n_train)
    if cfg.val_fraction > 0:
        _check_window(cfg, "validation", n_val)
    lengths = tok.token_byte_lengths()
    counts = {
        "train_documents": docs_train, "val_documents": docs_val, "train_tokens": n_train, "val_tokens": n_val,
        "train_bytes": sum(_count_bytes(all_tokens[a:b], lengths) for a, b in train_ranges),
        "val_bytes": sum(_count_bytes(all_tokens[a:b], lengths) for a, b in val_ranges),
    }
    _copy_tokens(all_tokens, train_ranges, staging / "train.bin", dtype)
    _copy_tokens(all_tokens, val_ranges, staging / "val.bin", dtype)
    del all_tokens
    all_path.unlink()
    tok.save(staging / "tokenizer")
    return counts


def _build(cfg: DataConfig, staging: Path, progress: bool | None) -> dict:
    """Everything prepare writes, into the empty folder `staging`, in stages: read the documents,
    train (or load) the tokenizer, encode, split and write; returns the meta dict."""
    t_start = time.perf_counter()
    sources = _resolve_sources(cfg)
    total_input = sum(s.path.stat().st_size for s in sources)
    documents = _document_reader(cfg, sources, total_input)
    if next(documents(), None) is None:
        raise UserError(f"no text found in {', '.join(cfg.paths)}: every input document is empty")
    tok = _build_tokenizer(cfg, (doc for _, doc in documents()))  # stage 2
    t_tokenizer = time.perf_counter()
    all_path = staging / "all.tokens"
    doc_lengths, input_bytes = _encode_all(tok, documents, total_input, all_path, progress)
    t_encode = time.perf_counter()
    counts = _split_and_write(cfg, tok, all_path, doc_lengths, staging)
    t_end = time.perf_counter()
    meta = {
        "format_version": FORMAT_VERSION, "tokenizer": tok.kind, "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id, "eos_id": tok.eos_id, "dtype": shard_dtype(tok.vocab_size).name, "split": cfg.split,
        "val_fraction": cfg.val_fraction, "seed": cfg.seed, "documents": len(doc_lengths), **counts,
        "input_bytes": input_bytes, "sources": _source_records(sources), "config": cfg.to_dict(),
        "seconds": {
            "tokenizer": round(t_tokenizer - t_start, 3),
            "encode": round(t_encode - t_tokenizer, 3),
            "total": round(t_end - t_start, 3),
        },
    }
    (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


PREPARE = "scratchlm prepare"
"""The command named in the marker of a folder prepare wrote (scratchlm.outdir)."""
OUTPUT_NAMES = ("train.bin", "val.bin", "meta.json", "tokenizer")
STAGING_PREFIX = ".staging-"


def _is_own_name(name: str) -> bool:
    return name in OUTPUT_NAMES or name.startswith(STAGING_PREFIX)


def prepare(cfg: DataConfig, out_dir: str | os.PathLike, *, progress: bool | None = None) -> Path:
    """Tokenize the configured text into out_dir (train.bin, val.bin, meta.json, tokenizer/).

    out_dir must be new, empty, or a folder prepare wrote before (scratchlm.outdir: its marker,
    or a complete output from before markers), and hold none of the input; one prepare at a time
    writes it (its lock). Everything is built in a hidden staging folder inside out_dir first, so
    a failure (bad input, a full disk, an interrupt) leaves out_dir exactly as it was. Publishing
    renames the new files in, with meta.json removed first and written last: a folder with a
    meta.json is complete. `progress`: show a progress bar (None: when stderr is a terminal)."""
    return _prepare_into(cfg, Path(out_dir).expanduser(), progress, cache=False)


def _prepare_into(cfg: DataConfig, out_dir: Path, progress: bool | None, *, cache: bool) -> Path:
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
    inputs = [s.path for s in _resolve_sources(cfg)] if cfg.data != "shakespeare" else []
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
            _build_or_say_why(cfg, staging, out_dir, progress, flag)
            mark(out_dir, PREPARE)  # before publishing: a kill part-way leaves a folder a rerun knows as its own
            _publish(staging, out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        lock.release()
    return out_dir


def _build_or_say_why(cfg: DataConfig, staging: Path, out_dir: Path, progress: bool | None, flag: str) -> None:
    """_build, with a write that fails for lack of space said in one line that names out_dir
    (not the staging file numpy was writing) and that nothing in it changed."""
    try:
        _build(cfg, staging, progress)
    except OSError as exc:
        if not out_of_room(exc):
            raise
        raise UserError(f"{out_dir}: no room to write the prepared data: {why_write_failed(exc)}; nothing in {out_dir} "
                        "was changed and the partial files were removed. Free some space, or choose another "
                        f"{flag}") from None


def _publish(staging: Path, out_dir: Path) -> None:
    """Move the staged output into out_dir (the same file system, so each step is a rename)."""
    meta = out_dir / "meta.json"
    if meta.exists():
        meta.unlink()  # from here until the new meta.json lands, the folder reads as incomplete
    old_tok = out_dir / "tokenizer"
    if old_tok.exists():
        os.rename(old_tok, staging / "tokenizer-old")  # removed with the staging folder
    os.rename(staging / "tokenizer", old_tok)
    for name in ("train.bin", "val.bin", "meta.json"):
        os.replace(staging / name, out_dir / name)


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
    stamp: dict = {"format": FORMAT_VERSION, "config": keyed, "sources": [_file_stamp(s.path) for s in _resolve_sources(cfg)]}
    if cfg.tokenizer_file is not None:
        tf = Path(cfg.tokenizer_file).expanduser()
        files = sorted(p for p in tf.rglob("*") if p.is_file()) if tf.is_dir() else [tf]
        if not all(p.exists() for p in files):
            raise UserError(f"{tf}: no such tokenizer file")
        stamp["tokenizer_file"] = [_file_stamp(p) for p in files]
    digest = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]
    label = "shakespeare" if cfg.data == "shakespeare" else Path(cfg.paths[0]).stem or "data"
    return Path(root if root is not None else cache_root()).expanduser() / f"{label}-{cfg.tokenizer}-{digest}"


def is_prepared(directory: str | os.PathLike) -> bool:
    """True if directory holds a complete prepare output whose shards match its meta.json."""
    directory = Path(directory)
    try:
        meta = read_meta(directory)
        ok = meta.get("format_version") == FORMAT_VERSION
        ok = ok and len(read_shard(directory / "train.bin")) == meta["train_tokens"]
        ok = ok and len(read_shard(directory / "val.bin")) == meta["val_tokens"]
        return bool(ok and (directory / "tokenizer").is_dir())
    except (UserError, KeyError, TypeError):
        return False


def ensure_prepared(cfg: DataConfig, cache_root: str | os.PathLike | None = None, *, progress: bool | None = None) -> Path:
    """A prepared folder for cfg: reused from the cache when its inputs are unchanged, else made.
    Under DDP call it on one rank and let the others wait (a barrier), then call it everywhere."""
    directory = cache_dir(cfg, cache_root)
    if not is_prepared(directory):  # made here, or by another process that holds it now (then waited for)
        _prepare_into(cfg, directory, progress, cache=True)
    meta = read_meta(directory)
    _check_window(cfg, "train", meta["train_tokens"])
    if cfg.val_fraction > 0:
        _check_window(cfg, "validation", meta["val_tokens"])
    return directory
