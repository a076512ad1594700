"""Files: where scratchlm keeps its own (the cache folder), and how it writes anyone's (whole or
not at all). Nothing here imports the rest of the package, so every module may import it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def cache_home() -> Path:
    """scratchlm's cache folder: $SCRATCHLM_CACHE, else ~/.cache/scratchlm. Prepared data goes in
    its data/ (scratchlm.data.cache_root), the compiled kernels (decoding and training) in kernels/
    unless $SCRATCHLM_KERNEL_CACHE names another folder, the measured CPU matmul peak in
    cpu_peak.json."""
    env = os.environ.get("SCRATCHLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "scratchlm"


def umask() -> int:
    """The process's file-creation mask (read without changing it for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", *, durable: bool = False) -> Iterator[IO]:
    """open(path, mode) whose content appears under `path` only once the block ends without an
    exception: it is written to a temporary file beside `path`, which then replaces it in one
    rename, so a reader sees the old file or the new one, never a mix, and a failure (or a
    kill) leaves `path` as it was and no temporary file behind (a kill -9 can leave one, named
    `.NAME.*.tmp`). durable=True also flushes the data to the disk before the rename. The new
    file gets the usual permissions (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
