"""Streaming readers for local data files: ``.npy`` (:mod:`.npyio`), CSV (:mod:`.csvio`) and
Parquet (:mod:`.parquetio`), chosen by the file's suffix (``.npy``; ``.csv`` or ``.txt``;
``.parquet`` or ``.pq``).

A :class:`DataSource` yields chunks of at most ``rows`` records, so peak memory is O(rows·d),
whatever the number of records n (for Parquet, one row group; see its module). Records keep
their precision: float32 for a float32 ``.npy`` or Parquet file, float64 for every other file,
so that a value beyond the float32 range reaches the public box of :mod:`fedsketch.common.sketch.box`
intact and is clipped there, never narrowed to ±inf first. Every chunk is checked: a NaN or an
infinity is not a record and stops the read with a :class:`DataError` that names the file, the
record (a CSV's line) and the column, counted from 1 (:mod:`.dataformat`).

A :class:`DataSource` describes the file as it was when it was opened (its layout, n and d).
Every pass checks, before and after it reads, that it still reads that file: a file replaced
(another inode) or rewritten (another size, modification or status-change time; for ``.npy``
also another header, for Parquet another schema or record count) since stops the pass with a
:class:`DataError` rather than reading new bytes with the old layout. Open a new DataSource to
read the new file. Replace a data file by writing a new one and renaming it over the old, never
by rewriting it in place.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..atomicfile import atomic_write
from .csvio import csv_blocks, csv_layout
from .dataformat import AS_IS, Block, DataError, ReadOptions
from .npyio import npy_blocks, npy_layout

__all__ = ["AS_IS", "CHUNK_ROWS", "DataError", "DataSource", "ReadOptions", "load_all", "write_npy_stream"]

#: Default chunk length in records (64 Ki records of d = 10 float32 are 2.5 MiB).
CHUNK_ROWS = 65536

#: File suffixes (lower case) of each format.
NPY, CSV, PARQUET = (".npy",), (".csv", ".txt"), (".parquet", ".pq")


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """What identifies one version of a file: device, inode, size (bytes), mtime and ctime (ns;
    ctime cannot be set back by a program, so a rewrite that restores mtime still shows)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _check_finite(block: Block, path: Path, limit: float = np.inf) -> None:
    """DataError at the first value of ``block`` that is NaN, infinite or beyond ``limit``."""
    bad = ~np.isfinite(block.x) | (np.abs(block.x) > limit)
    if bad.any():
        i = int(np.argmax(bad.any(axis=1)))
        j = int(np.argmax(bad[i]))
        value = block.x[i, j]
        if np.isfinite(value):
            raise DataError(f"{path}, {block.where(i, j)} holds {value:g}, beyond the float32 range")
        what = "a NaN (not a number)" if np.isnan(value) else f"an infinity ({value})"
        raise DataError(f"{path}, {block.where(i, j)} holds {what}, which no clipping can map into a "
                        "box; fix or drop that record")


class DataSource:
    """A local data file read in chunks of records (module docstring for dtype and memory).

    ``n`` and ``d`` are known after construction: from the header of an ``.npy`` and the
    metadata of a Parquet file; a CSV is read once through to count its records and parse every
    one (cheap next to sketching). ``options`` (``--header/--no-header``, ``--columns``) say how
    to read it; ``columns`` holds the names of the columns read (None for a file without names)
    and ``notes`` what the reader decided on its own (a header taken as such, pandas' index
    column dropped), for the user to see.

    A file without records is refused unless ``allow_empty`` (a device under add/remove takes
    part with n = 0): an ``.npy`` of shape (0, d), a CSV holding only a header (d = its columns
    read), a Parquet file without rows.
    """

    def __init__(self, path: str | os.PathLike[str], rows: int = CHUNK_ROWS, *,
                 allow_empty: bool = False, options: ReadOptions = AS_IS) -> None:
        self.path = Path(path)
        self.rows = int(rows)
        if not self.path.is_file():
            raise DataError(f"{self.path}: " + ("a folder, not a data file" if self.path.is_dir()
                                                else "no such file"))
        st = self.path.stat()
        self._stamp = _stamp(st)
        if st.st_size == 0:
            raise DataError(f"{self.path}: empty file")
        suffix = self.path.suffix.lower()
        self.columns: tuple[str, ...] | None = None
        self.notes: tuple[str, ...] = ()
        if suffix in NPY:
            if options != AS_IS:
                raise DataError(f"{self.path}: an .npy file has no header and no column names; "
                                "--header/--no-header and --columns are for CSV and Parquet")
            with self._open("rb") as fh:
                self._layout = npy_layout(fh, self.path, st.st_size)
                fh.seek(0)
                self._head = fh.read(self._layout.offset)
            self.n, self.d = self._layout.n, self._layout.d
            if self._layout.fortran:
                self.notes = ("Fortran-ordered (column-major) array, read in column runs",)
        elif suffix in CSV:
            with self._open("rb") as fh:
                if fh.read(2) in (b"\xff\xfe", b"\xfe\xff"):  # the byte-order marks of UTF-16
                    raise DataError(f"{self.path}: UTF-16 text; save it as UTF-8 (Excel: CSV UTF-8)")
            self._layout, self.n = csv_layout(lambda: self._open("r"), self.path, options, self.rows)
            self.d, self.notes = self._layout.d, self._layout.notes
            if self._layout.names is not None:
                self.columns = tuple(self._layout.names[c] for c in self._layout.usecols)
        elif suffix in PARQUET:
            from .parquetio import parquet_layout  # pyarrow loads only for a Parquet file

            with self._open("rb") as fh:
                self._layout = parquet_layout(fh, self.path, options)
            self.n, self.d = self._layout.n, self._layout.d
            self.columns, self.notes = self._layout.columns, self._layout.notes
        else:
            raise DataError(f"{self.path}: unknown data format {suffix!r}; use .npy, .csv or .parquet")
        if self.n == 0 and not allow_empty:
            raise DataError(f"{self.path}: no records")

    def chunks(self) -> Iterator[np.ndarray]:
        """Yield arrays of shape (≤ rows, d), in file order, each checked finite (module docstring
        for the dtype). DataError if the file is no longer the one this source opened."""
        for block in self._blocks():
            _check_finite(block, self.path)
            yield block.x

    def _blocks(self) -> Iterator[Block]:
        """The file's blocks in one checked pass, not checked finite."""
        suffix = self.path.suffix.lower()
        with self._open("r" if suffix in CSV else "rb") as fh:
            if suffix in CSV:
                yield from csv_blocks(fh, self.path, self._layout, self.rows)
            elif suffix in PARQUET:
                from .parquetio import parquet_blocks

                yield from parquet_blocks(fh, self.path, self._layout, self.rows)
            else:
                if fh.read(self._layout.offset) != self._head:
                    raise DataError(f"{self.path} changed while it was in use (another header); it "
                                    "is opened afresh for the next study")
                yield from npy_blocks(fh, self.path, self._layout, self.rows)

    @contextmanager
    def _open(self, mode: str) -> Iterator:
        """The file, open for one pass, checked to be the version this source opened, before the
        pass and after it (module docstring)."""
        text = {"encoding": "utf-8-sig", "errors": "replace"}  # -sig: drops Excel's byte-order mark
        with self.path.open(mode, **({} if "b" in mode else text)) as fh:
            self._check_stamp(fh)
            yield fh
            self._check_stamp(fh)

    def _check_stamp(self, fh) -> None:
        if _stamp(os.fstat(fh.fileno())) != self._stamp:
            raise DataError(f"{self.path} changed while it was in use (replaced or rewritten); "
                            "it is opened afresh for the next study")


def load_all(data: str | os.PathLike[str] | DataSource, options: ReadOptions = AS_IS) -> np.ndarray:
    """Read a whole data file (a path, read with ``options``, or an open source) into one float32
    (n, d) array (for evaluation and tests).

    DataError if a value lies beyond the float32 range (it would become ±inf)."""
    source = data if isinstance(data, DataSource) else DataSource(data, options=options)
    limit = float(np.finfo(np.float32).max)
    parts = []
    for block in source._blocks():
        _check_finite(block, source.path, limit)
        parts.append(block.x.astype(np.float32))
    return np.concatenate(parts, axis=0) if parts else np.zeros((0, source.d), np.float32)


def write_npy_stream(path: Path, n: int, d: int, chunks: Iterator[np.ndarray]) -> None:
    """Write a float32 (n, d) ``.npy`` file from an iterator of row chunks, atomically.

    The bytes go to a temporary sibling first and are renamed into place only when all ``n``
    rows are written, so a failure never leaves a partial file at ``path``.
    """
    with atomic_write(path) as fh:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")),
                  "fortran_order": False, "shape": (n, d)}
        np.lib.format.write_array_header_1_0(fh, header)
        written = 0
        for chunk in chunks:
            fh.write(np.ascontiguousarray(chunk, dtype="<f4").tobytes())
            written += chunk.shape[0]
        if written != n:
            raise RuntimeError(f"internal error: wrote {written} of {n} records")
