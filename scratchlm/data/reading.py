"""Documents in, pieces out: the input files `prepare` reads, streamed in bounded memory.

Each kind of file is read a bounded amount at a time: a text file in blocks of READ_BYTES (one
document, however large), a JSONL file a line at a time (one document per line), a parquet
file a batch of rows at a time (one document per row). Every document is cut into pieces of
about CHUNK_CHARS characters where its tokenizer allows (scratchlm.data.cutting), so what is held
at once is a few pieces, never a whole file.
"""
from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from scratchlm.data.config import TEXT_SUFFIXES, DataConfig
from scratchlm.data.cutting import Cutter
from scratchlm.errors import UserError
from scratchlm.text.tang import is_tang, tang_corpus
from scratchlm.text.text_files import without_bom

READ_BYTES = 1 << 20
PARQUET_ROWS = 1024


@dataclass
class Source:
    path: Path
    kind: str  # "txt", "jsonl", "parquet" or "play" (a built-in Markdown play)


@dataclass
class Piece:
    """Part of a document, in order. `first`: the document starts here (its BOS goes before)."""

    text: str
    first: bool


def resolve_sources(cfg: DataConfig) -> list[Source]:
    """The input files, in the order their documents are read."""
    if cfg.data == "shakespeare":
        from scratchlm.text.corpus import shakespeare_files

        return [Source(p, "play") for p in shakespeare_files()]
    if is_tang(cfg.data):
        return [Source(tang_corpus(cfg.data), "jsonl")]
    sources: list[Source] = []
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
            sources.extend(Source(p, p.suffix[1:]) for p in found)
        elif path.is_file():
            kind = path.suffix[1:] if path.suffix in (".jsonl", ".parquet") else "txt"
            sources.append(Source(path, kind))
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


def _text_blocks(path: Path, errors: str) -> Iterator[tuple[str, int]]:
    """(decoded text, bytes read) for each block of a text file, the BOM dropped; a character
    split between two blocks is decoded whole in the second."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)
    read = 0
    start = True
    with open(path, "rb") as f:
        while True:
            block = f.read(READ_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}: invalid UTF-8 at byte offset {read - pending + exc.start}; "
                                "fix the file or pass --errors replace") from None
            if start and text:
                text, start = without_bom(text), False
            read += len(block)
            yield text, len(block)
            if not block:
                return


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _jsonl_documents(path: Path, errors: str) -> Iterator[tuple[str, int]]:
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not (raw[3:] if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else raw).strip():
                yield "", len(raw)
                continue
            line = _decode(raw, errors, f"{path} line {lineno}", start)
            line = without_bom(line) if lineno == 1 else line
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                why = exc.args[0] if isinstance(exc, ValueError) else "nested too deeply"
                raise UserError(f"{path} line {lineno}: not valid JSON ({why})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise UserError(f"{path} line {lineno}: expected a JSON object with a string field \"text\"")
            text = record["text"]
            if _SURROGATE_ESCAPE.search(raw):  # \ud83d alone: JSON allows it, Unicode text cannot hold it
                text = _without_lone_surrogates(text, errors, f"{path} line {lineno}")
            yield text, len(raw)


def _without_lone_surrogates(text: str, errors: str, where: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        if errors == "strict":
            raise UserError(f"{where}: \"text\" holds a lone surrogate escape (half of a \\uXXXX pair), which is not "
                            "text; fix the line or pass --errors replace") from None
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _parquet_documents(path: Path) -> Iterator[tuple[str, int]]:
    """Rows of the "text" column, a batch at a time; the bytes are the file's, shared out by rows."""
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
    size, rows = path.stat().st_size, max(1, pf.metadata.num_rows)
    done = 0
    batches = pf.iter_batches(batch_size=PARQUET_ROWS, columns=["text"])
    with pf:
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise UserError(f"{path}: cannot read row {done + 1:,} on ({exc})") from None
            if batch is None:
                return
            values = batch.column(0).to_pylist()
            for i, value in enumerate(values):
                later = size * (done + i + 1) // rows - size * (done + i) // rows
                yield (value or ""), later
            done += len(values)


def _whole_documents(source: Source, errors: str) -> Iterator[tuple[str, int]]:
    """(document, bytes of the file it took) for JSONL, parquet and the built-in plays."""
    if source.kind == "jsonl":
        yield from _jsonl_documents(source.path, errors)
    elif source.kind == "parquet":
        yield from _parquet_documents(source.path)
    elif source.kind == "play":
        from scratchlm.text.corpus import markdown_play_to_text

        raw = source.path.read_bytes()  # a built-in play: a few hundred KB
        yield markdown_play_to_text(without_bom(_decode(raw, errors, str(source.path)))), len(raw)
    else:  # pragma: no cover - resolve_sources only makes the kinds above
        raise AssertionError(source.kind)


def source_pieces(source: Source, errors: str, cutter: Cutter) -> Iterator[tuple[Piece, int]]:
    """(piece, input bytes read since the previous piece) for every non-empty document of one
    file, in order."""
    if source.kind == "txt" and cutter.rule is None:  # no cuts: the file is one piece
        blocks = list(_text_blocks(source.path, errors))
        text = "".join(t for t, _ in blocks)
        if text:
            yield Piece(text, True), sum(n for _, n in blocks)
    elif source.kind == "txt":
        rest, first, read = "", True, 0
        for text, n in _text_blocks(source.path, errors):
            read += n
            pieces, rest = cutter.pieces(rest + text if rest else text, final=not n)
            for piece in pieces:
                yield Piece(piece, first), read
                first, read = False, 0
    else:
        for doc, n in _whole_documents(source, errors):
            pieces, _ = cutter.pieces(doc, final=True)
            for i, piece in enumerate(pieces):
                yield Piece(piece, i == 0), n if i == 0 else 0


def iter_pieces(sources: list[Source], errors: str, cutter: Cutter) -> Iterator[tuple[Piece, int]]:
    """source_pieces over every source, one after another."""
    for source in sources:
        yield from source_pieces(source, errors, cutter)


def iter_documents(cfg: DataConfig) -> Iterator[str]:
    """Every non-empty document of the configured input, whole, in a fixed order (each one is
    held in memory: a big text file is one big string; prepare itself streams pieces)."""
    cutter = Cutter(None)
    doc: list[str] = []
    for piece, _ in iter_pieces(resolve_sources(cfg), cfg.errors, cutter):
        if piece.first and doc:
            yield "".join(doc)
            doc = []
        doc.append(piece.text)
    if doc:
        yield "".join(doc)
