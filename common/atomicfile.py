"""Atomic file writes: the bytes go to a temporary sibling, which is renamed onto the target only
when the writer finishes, so a failure at any point never leaves a partial file at the target."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_write(path: Path, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary handle on ``.{name}.partial-{pid}`` beside ``path``, renamed to ``path`` when the
    block exits normally and removed otherwise. ``mode`` (e.g. 0o600 for keys) creates the
    temporary file exclusively with exactly those permission bits; None uses the umask."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        if mode is None:
            fh = tmp.open("wb")
        else:
            fh = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb")
            os.fchmod(fh.fileno(), mode)
        with fh:
            yield fh
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
