"""Text to batches (stations 2-4): `preparation` reads documents, tokenizes them and writes token
shards (with `config`, `reading`, `cutting`, `encoding` and `writing` for its stages); `shards`
reads those shards and cuts (B, T) batches out of them. The names most callers need are here."""

from scratchlm.data.config import (
    BPE_SAMPLE_BYTES,
    CHUNK_CHARS,
    DEFAULT_BPE_VOCAB,
    DEFAULT_SHARD_TOKENS,
    ERRORS,
    SPLITS,
    TEXT_SUFFIXES,
    DataConfig,
)
from scratchlm.data.cutting import split_for_encoding
from scratchlm.data.preparation import (
    PrepareOptions,
    cache_dir,
    cache_root,
    ensure_prepared,
    is_prepared,
    prepare,
)
from scratchlm.data.reading import iter_documents
from scratchlm.data.shards import (
    DTYPES,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    BatchStream,
    ShardedTokens,
    pad_batch,
    padded_vocab_size,
    read_meta,
    read_shard,
    read_split,
    shard_dtype,
    split_files,
    write_shard,
)

__all__ = [
    "BPE_SAMPLE_BYTES", "CHUNK_CHARS", "DEFAULT_BPE_VOCAB", "DEFAULT_SHARD_TOKENS", "DTYPES", "ERRORS",
    "FORMAT_VERSION", "HEADER", "MAGIC", "SPLITS", "TEXT_SUFFIXES", "BatchStream", "DataConfig", "PrepareOptions",
    "ShardedTokens", "cache_dir", "cache_root", "ensure_prepared", "is_prepared", "iter_documents", "pad_batch",
    "padded_vocab_size", "prepare", "read_meta", "read_shard", "read_split", "shard_dtype", "split_files",
    "split_for_encoding", "write_shard",
]
