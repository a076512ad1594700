"""Text to batches (stations 2-4): `preparation` reads documents, tokenizes them and writes token
shards; `shards` reads those shards and cuts (B, T) batches out of them. The names most callers
need are here."""

from scratchlm.data.preparation import (
    CHUNK_CHARS,
    DEFAULT_BPE_VOCAB,
    ERRORS,
    IN_MEMORY_BYTES,
    SPLITS,
    TEXT_SUFFIXES,
    DataConfig,
    cache_dir,
    cache_root,
    ensure_prepared,
    is_prepared,
    iter_documents,
    prepare,
    split_for_encoding,
)
from scratchlm.data.shards import (
    DTYPES,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    BatchStream,
    pad_batch,
    padded_vocab_size,
    read_meta,
    read_shard,
    shard_dtype,
    write_shard,
)

__all__ = [
    "CHUNK_CHARS", "DEFAULT_BPE_VOCAB", "DTYPES", "ERRORS", "FORMAT_VERSION", "HEADER", "IN_MEMORY_BYTES", "MAGIC",
    "SPLITS", "TEXT_SUFFIXES", "BatchStream", "DataConfig", "cache_dir", "cache_root", "ensure_prepared",
    "is_prepared", "iter_documents", "pad_batch", "padded_vocab_size", "prepare", "read_meta", "read_shard",
    "shard_dtype", "split_for_encoding", "write_shard",
]
