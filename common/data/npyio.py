"""Streaming reader of ``.npy`` files: a 2-D (or 1-D: one column) array of a real numeric dtype,
in C order (row-major, as ``np.save`` writes a NumPy array) or Fortran order (column-major, as
``np.save`` writes ``pandas.DataFrame.to_numpy()``, which is a transposed view).

Memory is O(rows·d) for both orders: a chunk of ``rows`` records is
- in C order, one contiguous run of rows·d values, read with one ``read()``;
- in Fortran order, d runs of ``rows`` values, one per column (column j of records [a, a+t) lies
  at byte offset + (j·n + a)·itemsize), read with one seek and one ``read()`` each and placed
  side by side. That is d reads per chunk instead of one, but never a whole column (O(n)) nor
  the whole file in memory, so a file larger than memory streams in either order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .dataformat import Block, DataError, column_label


@dataclass(frozen=True)
class NpyLayout:
    """Where the records of a ``.npy`` file live: shape (n, d), dtype, header length (bytes) and
    order (``fortran``: column-major)."""

    n: int
    d: int
    dtype: np.dtype
    offset: int
    fortran: bool = False


def npy_layout(fh: BinaryIO, path: Path, size: int) -> NpyLayout:
    """The layout of the ``.npy`` file open as ``fh`` (at its start; ``size`` bytes long)."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    except ValueError as exc:
        raise DataError(f"{path}: not a valid .npy file ({exc})") from None
    offset = fh.tell()
    if dtype.kind not in "fiu" or dtype.hasobject:
        raise DataError(f"{path}: dtype {dtype} is not a real numeric type")
    if len(shape) == 1:
        shape = (shape[0], 1)
    if len(shape) != 2:
        raise DataError(f"{path}: expected a 2-D array (records × dimensions), got shape {shape}")
    n, d = int(shape[0]), int(shape[1])
    expected = offset + n * d * dtype.itemsize
    if size < expected:
        raise DataError(f"{path}: truncated file ({size} of {expected} bytes)")
    return NpyLayout(n=n, d=d, dtype=dtype, offset=offset, fortran=bool(fortran) and d > 1)


def npy_blocks(fh: BinaryIO, path: Path, layout: NpyLayout, rows: int) -> Iterator[Block]:
    """The records of ``fh`` (positioned just after the header) in blocks of ≤ ``rows`` records,
    as float32 for a float32 file and float64 otherwise (exact for every integer dtype up to
    2^53 and every float dtype up to float64)."""
    out = np.float32 if layout.dtype == np.float32 else np.float64
    labels = tuple(column_label(j + 1, None) for j in range(layout.d))
    size = layout.dtype.itemsize
    done = 0
    while done < layout.n:
        take = min(rows, layout.n - done)
        if layout.fortran:
            chunk = np.empty((take, layout.d), dtype=out)
            for j in range(layout.d):
                fh.seek(layout.offset + (j * layout.n + done) * size)
                chunk[:, j] = _values(fh.read(take * size), take, layout.dtype, path, done)
        else:
            flat = _values(fh.read(take * layout.d * size), take * layout.d, layout.dtype, path, done)
            chunk = flat.reshape(take, layout.d).astype(out)
        yield Block(chunk, done, None, labels)
        done += take


def _values(raw: bytes, count: int, dtype: np.dtype, path: Path, done: int) -> np.ndarray:
    if len(raw) != count * dtype.itemsize:
        raise DataError(f"{path}: truncated at record {done + 1}")
    return np.frombuffer(raw, dtype=dtype)
