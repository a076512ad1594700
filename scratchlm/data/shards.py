"""Token shards and batches: the files `prepare` writes and the (B, T) rows training reads.

A shard is a fixed 24-byte header then the ids, little-endian:

    magic b"SLMTOKEN" | version uint32 (1) | bytes per id uint32 (2 or 4) | token count uint64

read_shard() checks the header against the file size and returns a numpy memmap of the ids.
A prepared folder splits its stream into train and val shards, listed in its meta.json;
read_split() gives one split's ids as one array (ShardedTokens when it spans several files).
BatchStream cuts (B, T+1) rows out of such an array: inputs are row[:, :-1], targets row[:, 1:].
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from scratchlm.errors import ConfigError, UserError
from scratchlm.fileio import atomic_write

FORMAT_VERSION = 1
MAGIC = b"SLMTOKEN"
HEADER = struct.Struct("<8sIIQ")  # magic, version, bytes per id, token count
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def padded_vocab_size(n: int, multiple: int = 64) -> int:
    """n rounded up to a multiple (50257 -> 50304): matmuls run faster on round sizes; the
    extra ids are never produced by the tokenizer, so the model learns to give them no mass."""
    return -(-n // multiple) * multiple


# ----------------------------------------------------------------------------------------------
# shards


def shard_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits in it, else uint32."""
    return DTYPES[2] if vocab_size <= 1 << 16 else DTYPES[4]


def write_shard(path: str | os.PathLike, tokens: np.ndarray | Sequence[int], dtype: np.dtype | str | None = None) -> Path:
    """Write ids as a shard, atomically (a temp file in the same folder, then rename)."""
    path = Path(path)
    arr = np.asarray(tokens)
    dtype = np.dtype(dtype).newbyteorder("<") if dtype is not None else (DTYPES[2] if arr.size == 0 or arr.max() < 1 << 16 else DTYPES[4])
    if dtype.itemsize not in DTYPES:
        raise ValueError(f"shards hold uint16 or uint32 ids, not {dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= 1 << (8 * dtype.itemsize)):
        raise ValueError(f"ids outside the range of {dtype}")
    with atomic_write(path) as f:
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, dtype.itemsize, arr.size))
        arr.astype(dtype, copy=False).tofile(f)
    return path


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """The ids of a shard as a read-only memmap (nothing is loaded until indexed)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except FileNotFoundError:
        raise UserError(f"{path}: no such token shard; run `scratchlm prepare` first") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read token shard ({exc.strerror})") from None
    if len(head) < HEADER.size:
        raise UserError(f"{path}: truncated token shard: {size} bytes, shorter than the {HEADER.size}-byte header; prepare the data again")
    magic, version, itemsize, count = HEADER.unpack(head)
    if magic != MAGIC:
        raise UserError(f"{path}: not a scratchlm token shard (magic bytes {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise UserError(f"{path}: token shard format version {version}, this scratchlm reads version {FORMAT_VERSION}; prepare the data again")
    if itemsize not in DTYPES:
        raise UserError(f"{path}: token shard header names {itemsize} bytes per id; only 2 (uint16) and 4 (uint32) exist")
    expected = HEADER.size + count * itemsize
    if size != expected:
        what = "truncated" if size < expected else "has trailing bytes"
        raise UserError(f"{path}: token shard {what}: its header says {count} ids ({expected} bytes in all) but the file holds {size} bytes; prepare the data again")
    if count == 0:
        return np.zeros(0, dtype=DTYPES[itemsize])
    return np.memmap(path, dtype=DTYPES[itemsize], mode="r", offset=HEADER.size, shape=(count,))


def read_meta(directory: str | os.PathLike) -> dict:
    """meta.json of a prepared directory."""
    path = Path(directory) / "meta.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{directory}: not a prepared data directory (no meta.json); run `scratchlm prepare`") from None
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def split_files(directory: str | os.PathLike, split: str, meta: dict | None = None) -> list[tuple[Path, int]]:
    """(shard path, ids it should hold) for one split ("train" or "val") of a prepared folder, in
    order; a folder from before shards holds one file per split, train.bin and val.bin."""
    directory = Path(directory)
    meta = read_meta(directory) if meta is None else meta
    if "shards" not in meta:
        return [(directory / f"{split}.bin", int(meta[f"{split}_tokens"]))]
    return [(directory / s["file"], int(s["tokens"])) for s in meta["shards"][split]]


def read_split(directory: str | os.PathLike, split: str, meta: dict | None = None):
    """The ids of one split of a prepared folder: a memmap when it is one shard, else a
    ShardedTokens over all of them. Each shard must hold what meta.json says."""
    arrays = []
    for path, count in split_files(directory, split, meta):
        ids = read_shard(path)
        if len(ids) != count:
            raise UserError(f"{path}: holds {len(ids)} ids, but meta.json says {count}; prepare the data again")
        arrays.append(ids)
    if len(arrays) == 1:
        return arrays[0]
    return ShardedTokens(arrays)


class ShardedTokens:
    """Several shards read as one 1-D array of ids, without loading them: len(), an index, a
    slice, or an integer array of positions (what BatchStream and evaluation take) all work
    across the shard boundaries."""

    ndim = 1

    def __init__(self, shards: Sequence[np.ndarray]):
        if not shards:
            raise ValueError("ShardedTokens needs at least one shard")
        self.shards = list(shards)
        self.dtype = np.result_type(*[s.dtype for s in self.shards])
        self.ends = np.cumsum([len(s) for s in self.shards]).astype(np.int64)
        self.starts = self.ends - [len(s) for s in self.shards]

    def __len__(self) -> int:
        return int(self.ends[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self[np.arange(len(self))[index]] if index.step not in (None, 1) else self._range(*index.indices(len(self))[:2])
        positions = np.asarray(index)
        if positions.dtype.kind not in "iu":
            raise TypeError(f"ShardedTokens takes integer positions or a slice, not {positions.dtype}")
        flat = positions.reshape(-1).astype(np.int64)
        flat = np.where(flat < 0, flat + len(self), flat)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"position out of range for {len(self)} ids")
        which = np.searchsorted(self.ends, flat, side="right")
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(which):
            at = which == k
            out[at] = self.shards[k][flat[at] - self.starts[k]]
        return out.reshape(positions.shape) if positions.ndim else out[0]

    def _range(self, a: int, b: int) -> np.ndarray:
        parts = [s[max(a - lo, 0) : min(b, hi) - lo] for s, lo, hi in zip(self.shards, self.starts, self.ends)
                 if lo < b and hi > a]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def __array__(self, dtype=None, copy=None):
        whole = self._range(0, len(self))
        return whole if dtype is None else whole.astype(dtype)

    def tolist(self) -> list[int]:
        return self._range(0, len(self)).tolist()


# ----------------------------------------------------------------------------------------------
# batches


class BatchStream:
    """(B, T) input and target batches cut from one token array, reproducible from a seed.

    mode="random": each row starts at a random position (nanoGPT's get_batch). With world_size W
    the array is cut into W equal contiguous parts and rank r only draws windows inside part r,
    so ranks never read the same tokens.
    mode="sequential": the array is packed into consecutive rows of T+1 tokens (row i covers
    tokens[i*T : i*T + T + 1], so every token after the first is a target exactly once); rank r
    takes rows r, r+W, r+2W, ...; batches walk through them in order and wrap around.

    `starts` (random mode only): the positions a row may start at (line_starts: after each
    newline or BOS); each row then starts at one of them, drawn uniformly.

    Batch k depends only on (seed, rank, k), so state_dict() is just a position and a resumed
    stream continues with exactly the batches the original would have produced."""

    MODES = ("random", "sequential")

    def __init__(self, tokens: np.ndarray, batch_size: int, block_size: int, *, seed: int, rank: int = 0,
                 world_size: int = 1, mode: str = "random", starts: np.ndarray | None = None):
        if mode not in self.MODES:
            raise ConfigError("mode", f"{mode!r} is not one of {', '.join(self.MODES)}")
        if batch_size <= 0 or block_size <= 0:
            raise ConfigError("batch_size", f"batch_size and block_size must be positive, got {batch_size}, {block_size}")
        if not 0 <= rank < world_size:
            raise ConfigError("rank", f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
        if np.ndim(tokens) != 1:
            raise ValueError("tokens must be a 1-D array")
        self.tokens = tokens
        self.batch_size, self.block_size = batch_size, block_size
        self.seed, self.rank, self.world_size, self.mode = int(seed), rank, world_size, mode
        self.step = 0
        self.starts: np.ndarray | None = None
        n, T = len(tokens), block_size
        if mode == "random":
            self.part = n // world_size  # tokens in each rank's part
            self.lo = rank * self.part
            if self.part < T + 1:
                raise UserError(self._too_short(f"{self.part} per rank" if world_size > 1 else "only"))
            if starts is not None:  # those with a whole window inside this rank's part
                starts = np.asarray(starts, dtype=np.int64)
                self.starts = starts[(starts >= self.lo) & (starts < self.lo + self.part - T)]
                if len(self.starts) == 0:
                    raise UserError(f"no line starts with a whole window of {T + 1} tokens after them"
                                    + (" in this rank's part" if world_size > 1 else "") + "; use --windows anywhere")
        else:
            self.rows_per_rank = ((n - 1) // T) // world_size if n > 0 else 0
            if self.rows_per_rank < 1:
                raise UserError(self._too_short(f"{n // world_size} per rank" if world_size > 1 else "only"))

    def _too_short(self, per: str) -> str:
        return (f"the data holds {len(self.tokens)} tokens ({per}), fewer than one window of block_size + 1 = "
                f"{self.block_size + 1}; use more text or a smaller block size")

    def _row_starts(self, k: int) -> np.ndarray:
        """(B,) start positions of batch k's rows."""
        B, T = self.batch_size, self.block_size
        if self.mode == "random":
            rng = np.random.default_rng([self.seed & (2**64 - 1), self.rank, k])
            if self.starts is not None:
                return self.starts[rng.integers(0, len(self.starts), size=B)]
            return self.lo + rng.integers(0, self.part - T, size=B)
        rows = (k * B + np.arange(B)) % self.rows_per_rank  # this rank's row numbers
        return (rows * self.world_size + self.rank) * T

    def next_batch(self):
        """(x, y): int64 tensors (B, T); y[:, t] is the token after x[:, t]."""
        import torch

        starts = self._row_starts(self.step)
        self.step += 1
        rows = np.asarray(self.tokens[starts[:, None] + np.arange(self.block_size + 1)], dtype=np.int64)  # (B, T+1)
        return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())

    def __iter__(self):
        while True:
            yield self.next_batch()

    def _geometry(self) -> dict:
        lines = {} if self.starts is None else {"line_starts": len(self.starts)}  # absent: any start (older states too)
        return {"mode": self.mode, "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                "batch_size": self.batch_size, "block_size": self.block_size, "num_tokens": len(self.tokens), **lines}

    def state_dict(self) -> dict:
        return {**self._geometry(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        geometry = self._geometry()
        for key in [*geometry, *(k for k in state if k not in geometry and k != "step")]:
            value = geometry.get(key)
            if state.get(key) != value:
                raise UserError(f"cannot resume the batch stream: it was saved with {key}={state.get(key)!r}, now {key}={value!r}")
        self.step = int(state["step"])


def line_starts(tokens, newline_ids, bos_id: int | None, chunk: int = 1 << 24) -> np.ndarray:
    """(N,) int64: every position right after a newline id (one id or several: those whose text
    ends a line) or BOS (a line's or a document's first token), and position 0; read in chunks,
    so shards on disk are never loaded whole."""
    marks = list(np.atleast_1d(newline_ids)) + ([bos_id] if bos_id is not None else [])
    found = [np.zeros(1, dtype=np.int64)]
    for lo in range(0, len(tokens), chunk):
        part = np.asarray(tokens[lo : lo + chunk])
        found.append(np.flatnonzero(np.isin(part, marks)).astype(np.int64) + lo + 1)
    starts = np.unique(np.concatenate(found))
    return starts[starts < len(tokens)]


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int):
    """Separate sequences -> (x, y, attention_mask), each (B, T) with T = longest length - 1 (station 4).

    Right padding: x holds pad_id, y holds -100 (ignored by the loss) and attention_mask 0 at
    padded positions; real positions have attention_mask 1 and y = the next token."""
    import torch

    if not seqs:
        raise UserError("pad_batch needs at least one sequence")
    lengths = [len(s) for s in seqs]
    if min(lengths) < 2:
        raise UserError("every sequence needs at least 2 tokens (an input and its target)")
    T = max(lengths) - 1
    x = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    y = torch.full((len(seqs), T), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        s = torch.as_tensor(list(s), dtype=torch.long)
        x[b, : len(s) - 1] = s[:-1]
        y[b, : len(s) - 1] = s[1:]
        mask[b, : len(s) - 1] = 1
    return x, y, mask
