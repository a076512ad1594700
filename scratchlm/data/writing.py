"""Token shards written as the ids come, and the train/val split made from them at the end.

Encoding appends every document's ids (BOS first) to numbered `part-NNNNN.bin` shards of at most
`shard_tokens` ids each, and the position of every BOS to `documents.u64`, all inside prepare's
staging folder. When the stream is complete its length is known, and the split is made:

- tail: the parts wholly before the cut are renamed `train-NNNNN.bin`, those wholly after it
  `val-NNNNN.bin`, and the one part the cut falls in is copied into the last train shard and the
  first val shard;
- documents: each document's ids are copied, in order, to the train or the val shards.

A shard is written under a `.part` name and renamed when its header holds its final count, so a
file with a shard's name is always whole. Memory stays at a block of ids whatever the corpus size;
the documents split alone holds a few bytes per document (the choice of validation documents).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from scratchlm.data.shards import FORMAT_VERSION, HEADER, MAGIC

COPY_BLOCK = 1 << 22
"""Ids read or written at a time when shards are copied."""


@dataclass
class Shard:
    name: str
    tokens: int
    bytes: int
    """UTF-8 bytes of text its ids stand for (scratchlm's token_byte_lengths)."""


class ShardWriter:
    """Ids appended to `folder/prefix-00000.bin`, `-00001.bin`, ... of at most shard_tokens each."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, shard_tokens: int, byte_lengths: np.ndarray):
        self.folder, self.prefix, self.dtype, self.shard_tokens = folder, prefix, np.dtype(dtype), shard_tokens
        self.byte_lengths = byte_lengths
        self.shards: list[Shard] = []
        self.total = 0
        self._file: BinaryIO | None = None
        self._count = self._bytes = 0

    def write(self, ids: np.ndarray, nbytes: int | None = None) -> None:
        """Append ids; `nbytes`, the bytes they stand for, when the caller counted them already."""
        ids = np.asarray(ids)
        while len(ids):
            if self._file is None:
                self._open()
            room = self.shard_tokens - self._count
            part, ids = ids[:room], ids[room:]
            part.astype(self.dtype, copy=False).tofile(self._file)
            self._count += len(part)
            whole = nbytes is not None and not len(ids)  # all of them went into this shard
            self._bytes += nbytes if whole else int(self.byte_lengths[part].sum())
            nbytes = None
            if self._count == self.shard_tokens:
                self._finish()
        self.total = sum(s.tokens for s in self.shards) + self._count

    def close(self) -> list[Shard]:
        """Finish the last shard (and write an empty one if nothing came); the shards written."""
        if self._file is None and not self.shards:
            self._open()
        if self._file is not None:
            self._finish()
        return self.shards

    def _name(self) -> str:
        return f"{self.prefix}-{len(self.shards):05d}.bin"

    def _open(self) -> None:
        self._file = open(self.folder / (self._name() + ".part"), "wb")
        self._file.write(HEADER.pack(MAGIC, FORMAT_VERSION, self.dtype.itemsize, 0))
        self._count = self._bytes = 0

    def _finish(self) -> None:
        f, name = self._file, self._name()
        f.seek(0)
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, self.dtype.itemsize, self._count))
        f.close()
        self._file = None
        os.replace(self.folder / (name + ".part"), self.folder / name)
        self.shards.append(Shard(name, self._count, self._bytes))
        self._count = self._bytes = 0

    def abandon(self) -> None:
        """Close an unfinished shard without naming it (its .part file goes with the staging folder)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_ids(path: Path, dtype: np.dtype, start: int, stop: int) -> Iterator[np.ndarray]:
    """Ids start..stop of a shard file, a block at a time."""
    with open(path, "rb") as f:
        f.seek(HEADER.size + start * dtype.itemsize)
        at = start
        while at < stop:
            block = np.fromfile(f, dtype=dtype, count=min(COPY_BLOCK, stop - at))
            if len(block) == 0:
                raise OSError(f"{path}: shorter than its header says")
            at += len(block)
            yield block


def read_positions(path: Path) -> Iterator[np.ndarray]:
    """The BOS positions of documents.u64, a block at a time."""
    with open(path, "rb") as f:
        while len(block := np.fromfile(f, dtype=np.uint64, count=COPY_BLOCK)):
            yield block


def split_tail(parts: list[Shard], n_train: int, folder: Path, dtype: np.dtype,
               byte_lengths: np.ndarray) -> tuple[list[Shard], list[Shard]]:
    """The parts as train shards up to token n_train and val shards after it (see the module)."""
    train: list[Shard] = []
    val: list[Shard] = []
    pos = 0
    for part in parts:
        end = pos + part.tokens
        if end <= n_train or pos >= n_train:
            side, prefix = (train, "train") if end <= n_train else (val, "val")
            name = f"{prefix}-{len(side):05d}.bin"
            os.replace(folder / part.name, folder / name)
            side.append(Shard(name, part.tokens, part.bytes))
        else:
            for side, prefix, a, b in ((train, "train", 0, n_train - pos), (val, "val", n_train - pos, part.tokens)):
                writer = ShardWriter(folder, prefix, dtype, max(1, b - a), byte_lengths)
                writer.shards = list(side)
                try:
                    for block in read_ids(folder / part.name, dtype, a, b):
                        writer.write(block)
                    side[:] = writer.close()
                finally:
                    writer.abandon()
            (folder / part.name).unlink()
        pos = end
    return train or _empty(folder, "train", dtype), val or _empty(folder, "val", dtype)


def _empty(folder: Path, prefix: str, dtype: np.dtype) -> list[Shard]:
    return ShardWriter(folder, prefix, dtype, 1, np.zeros(1, dtype=np.int64)).close()


def split_documents(parts: list[Shard], is_val: np.ndarray, folder: Path, positions: Path,
                    writers: tuple[ShardWriter, ShardWriter]) -> None:
    """Every document's ids, in order, to writers[1] if is_val[its number] else writers[0]; the
    parts are removed as they are used up."""
    dtype = writers[0].dtype
    total = sum(p.tokens for p in parts)
    blocks = (block for p in parts for block in _drain(folder / p.name, dtype, p.tokens))
    buffer, doc = np.zeros(0, dtype=dtype), 0
    starts = (int(x) for block in read_positions(positions) for x in block)
    start = next(starts, total)
    while start < total:
        end = next(starts, total)
        need = end - start
        writer = writers[1] if is_val[doc] else writers[0]
        while need:
            if not len(buffer):
                buffer = next(blocks)
            take, buffer = buffer[:need], buffer[need:]
            writer.write(take)
            need -= len(take)
        start, doc = end, doc + 1


def _drain(path: Path, dtype: np.dtype, count: int) -> Iterator[np.ndarray]:
    """A part's ids a block at a time; the file is removed once read."""
    yield from read_ids(path, dtype, 0, count)
    path.unlink()
