"""Pieces of text to token ids on a pool of threads, in order, into part shards (prepare's stage 3).

The main thread reads and cuts the input (scratchlm.data.reading) and gathers pieces into batches
of about BATCH_CHARS characters; each batch is encoded on one of `workers` threads. tiktoken (the
gpt2 and bpe encoders) and NumPy (char) let go of Python's lock while they work, so the threads
run on separate cores. Each thread encodes with its own copy of the tokenizer (`for_thread`):
threads sharing one tiktoken core also share its regex caches, and lose them to each other. At most IN_FLIGHT batches per worker wait or run at a time (two on a machine
with many cores), so memory holds a few dozen megabytes of text per core whatever the corpus size.
Results are taken in the order the batches were made and appended to the shards at once
(scratchlm.data.writing).
"""
from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from scratchlm.data.reading import Piece
from scratchlm.data.writing import Shard, ShardWriter

BATCH_CHARS = 1 << 20
"""A batch is at least this many characters of pieces (one piece of a long document; many short ones)."""
IN_FLIGHT = 8
"""Batches per worker that wait or run at a time: a thread that runs slow (a busy core on a shared
machine) holds up only its own batch, while the others keep taking work. Past MAX_IN_FLIGHT
batches in all, two per worker."""
MAX_IN_FLIGHT = 32


def default_workers() -> int:
    """One encoding thread per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass
class Encoded:
    """One batch: BOS + ids for each document that starts in it, and the ids of its other pieces."""

    ids: np.ndarray
    starts: np.ndarray
    """Offsets in ids of the BOS ids (int64)."""
    text_bytes: int
    """UTF-8 bytes of the batch's text."""
    token_bytes: int
    """Bytes its ids stand for (token_byte_lengths: special and unknown ids stand for none)."""
    input_bytes: int
    """Bytes of the input files read to make this batch (for the progress bar)."""


@dataclass
class Stream:
    """What stage 3 wrote: the part shards, the BOS positions file, and its counts."""

    parts: list[Shard]
    positions: Path
    documents: int
    tokens: int
    text_bytes: int


_worker = threading.local()
"""Each pool thread's own tokenizer (`.tok`), set when the thread starts."""


def _start_worker(tok) -> None:
    _worker.tok = tok.for_thread()


def _encode_batch(pieces: list[Piece], input_bytes: int, dtype: np.dtype, lengths: np.ndarray) -> Encoded:
    """Everything that can run beside the other threads does: encode, join, narrow to the
    shard's dtype, count bytes. A byte-level tokenizer's ids spell the text's UTF-8 bytes
    exactly, so their lengths give its size without encoding the text a second time."""
    tok = _worker.tok
    arrays: list[np.ndarray] = []
    starts: list[int] = []
    at = 0
    bos = np.array([tok.bos_id], dtype=np.uint32)
    for piece in pieces:
        if piece.first:
            arrays.append(bos)
            starts.append(at)
            at += 1
        ids = tok.encode_array(piece.text)
        arrays.append(ids)
        at += len(ids)
    ids = (np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)).astype(dtype, copy=False)
    token_bytes = int(lengths[ids].sum())
    text_bytes = token_bytes if tok.cut_rule == "gpt2" else sum(len(p.text.encode("utf-8")) for p in pieces)
    return Encoded(ids, np.array(starts, dtype=np.int64), text_bytes, token_bytes, input_bytes)


def _batches(pieces: Iterable[tuple[Piece, int]]) -> Iterator[tuple[list[Piece], int]]:
    batch: list[Piece] = []
    chars = read = 0
    for piece, n in pieces:
        batch.append(piece)
        chars += len(piece.text)
        read += n
        if chars >= BATCH_CHARS:
            yield batch, read
            batch, chars, read = [], 0, 0
    if batch or read:
        yield batch, read


def encode_in_order(tok, pieces: Iterable[tuple[Piece, int]], workers: int, dtype: np.dtype) -> Iterator[Encoded]:
    """Each batch of pieces encoded on the pool, yielded in the order of the pieces."""
    lengths = tok.token_byte_lengths()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scratchlm-encode",
                              initializer=_start_worker, initargs=(tok,))
    waiting: deque = deque()
    try:
        for batch, read in _batches(pieces):
            waiting.append(pool.submit(_encode_batch, batch, read, dtype, lengths))
            if len(waiting) >= max(2 * workers, min(IN_FLIGHT * workers, MAX_IN_FLIGHT)):
                yield waiting.popleft().result()
        while waiting:
            yield waiting.popleft().result()
    finally:  # an error or Ctrl-C: drop what has not started, let the running batches end
        pool.shutdown(wait=True, cancel_futures=True)


def encode_to_parts(tok, pieces: Iterable[tuple[Piece, int]], writer: ShardWriter, positions: Path,
                    workers: int, bar) -> Stream:
    """Stage 3: every piece's ids into the writer's shards, each BOS position into `positions`."""
    documents = text_bytes = 0
    try:
        with open(positions, "wb") as pos_file:
            for enc in encode_in_order(tok, pieces, workers, writer.dtype):
                (enc.starts + writer.total).astype(np.uint64).tofile(pos_file)
                writer.write(enc.ids, enc.token_bytes)
                documents += len(enc.starts)
                text_bytes += enc.text_bytes
                bar.update(enc.input_bytes)
                bar.set_postfix_str(f"{writer.total:,} tokens", refresh=False)
        bar.update(max(0, bar.total - bar.n))  # bytes of empty documents, blank lines and null rows
        parts = writer.close()
    finally:
        writer.abandon()
    return Stream(parts, positions, documents, writer.total, text_bytes)
