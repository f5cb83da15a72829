"""Streaming readers for local data files: ``.npy`` (2-D, C order) and CSV.

A :class:`DataSource` yields chunks of at most ``rows`` records, so peak memory is O(rows·d),
whatever the number of records n. Records keep their precision: float32 for a float32 ``.npy``,
float64 for every other file, so that a value beyond the float32 range reaches the public box of
:mod:`fedsketch.common.box` intact and is clipped there, never narrowed to ±inf first. ``.npy``
files are read with plain ``read()`` calls after the header, not memory-mapped whole. Every chunk
is checked: a NaN or an infinity is not a record and stops the read with a :class:`DataError`
that names the file and the row.

A :class:`DataSource` describes the file as it was when it was opened (its layout, n and d).
Every pass checks, before and after it reads, that it still reads that file: a file replaced
(another inode) or rewritten (another size, modification or status-change time; for ``.npy``
also another header) since stops the pass with a :class:`DataError` rather than reading new
bytes with the old layout. Open a new DataSource to read the new file. Replace a data file by
writing a new one and renaming it over the old, never by rewriting it in place.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomicfile import atomic_write

#: Default chunk length in records (64 Ki records of d = 10 float32 are 2.5 MiB).
CHUNK_ROWS = 65536


class DataError(ValueError):
    """A data file that cannot be used as it is (missing, empty, malformed, non-finite)."""


@dataclass(frozen=True)
class NpyLayout:
    """Where the records of a ``.npy`` file live: shape (n, d), dtype, and header length."""

    n: int
    d: int
    dtype: np.dtype
    offset: int


def _npy_layout(fh, path: Path, size: int) -> NpyLayout:
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
    if fortran and len(shape) > 1 and shape[1] > 1:
        raise DataError(f"{path}: Fortran-ordered arrays are not supported; save in C order")
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
    return NpyLayout(n=n, d=d, dtype=dtype, offset=offset)


def _check_finite(chunk: np.ndarray, path: Path, first_row: int) -> None:
    finite = np.isfinite(chunk)
    if not finite.all():
        row = first_row + int(np.argmin(finite.all(axis=1)))
        raise DataError(f"{path}: record {row} holds a NaN or an infinity, which no clipping can "
                        "map into a box; fix or drop that record")


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """What identifies one version of a file: device, inode, size (bytes), mtime and ctime (ns;
    ctime cannot be set back by a program, so a rewrite that restores mtime still shows)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _numeric(line: str) -> bool:
    """Whether a CSV line parses as numbers (else it is a header)."""
    try:
        [float(tok) for tok in line.replace(",", " ").split()]
    except ValueError:
        return False
    return True


class DataSource:
    """A local data file read in chunks of records (float32 for a float32 ``.npy``, else float64).

    ``n`` and ``d`` are known after construction for ``.npy``; for CSV, ``d`` comes from the first
    data row and ``n`` is counted by a first streaming pass (cheap next to sketching).
    A first CSV line that does not parse as numbers is taken as a header and skipped.

    A file without records is refused unless ``allow_empty`` (a device under add/remove takes
    part with n = 0): an ``.npy`` of shape (0, d), or a CSV holding only a header (d = its
    columns).
    """

    def __init__(self, path: str | os.PathLike[str], rows: int = CHUNK_ROWS, *,
                 allow_empty: bool = False) -> None:
        self.path = Path(path)
        self.rows = int(rows)
        if not self.path.is_file():
            raise DataError(f"{self.path}: no such file")
        st = self.path.stat()
        self._stamp = _stamp(st)
        if st.st_size == 0:
            raise DataError(f"{self.path}: empty file")
        suffix = self.path.suffix.lower()
        if suffix == ".npy":
            with self._open("rb") as fh:
                self._layout: NpyLayout | None = _npy_layout(fh, self.path, st.st_size)
                fh.seek(0)
                self._head = fh.read(self._layout.offset)
            self.n, self.d = self._layout.n, self._layout.d
        elif suffix in (".csv", ".txt"):
            self._layout = None
            with self._open("r") as fh:
                self._header, self.d = self._csv_shape(fh, allow_empty)
            self.n = sum(chunk.shape[0] for chunk in self._csv_chunks(check=False))
        else:
            raise DataError(f"{self.path}: unknown data format {suffix!r}; use .npy or .csv")
        if self.n == 0 and not allow_empty:
            raise DataError(f"{self.path}: no records")

    def chunks(self) -> Iterator[np.ndarray]:
        """Yield arrays of shape (≤ rows, d), in file order, each checked finite (module docstring
        for the dtype). DataError if the file is no longer the one this source opened."""
        if self._layout is not None:
            yield from self._npy_chunks(self._layout)
        else:
            yield from self._csv_chunks(check=True)

    @contextmanager
    def _open(self, mode: str) -> Iterator:
        """The file, open for one pass, checked to be the version this source opened, before the
        pass and after it (module docstring)."""
        with self.path.open(mode, **({} if "b" in mode else {"encoding": "utf-8",
                                                               "errors": "replace"})) as fh:
            self._check_stamp(fh)
            yield fh
            self._check_stamp(fh)

    def _check_stamp(self, fh) -> None:
        if _stamp(os.fstat(fh.fileno())) != self._stamp:
            raise DataError(f"{self.path} changed while it was in use (replaced or rewritten); "
                            "it is opened afresh for the next study")

    def _npy_chunks(self, layout: NpyLayout) -> Iterator[np.ndarray]:
        row_bytes = layout.d * layout.dtype.itemsize
        done = 0
        with self._open("rb") as fh:
            if fh.read(layout.offset) != self._head:
                raise DataError(f"{self.path} changed while it was in use (another header); it "
                                "is opened afresh for the next study")
            while done < layout.n:
                take = min(self.rows, layout.n - done)
                raw = fh.read(take * row_bytes)
                if len(raw) != take * row_bytes:
                    raise DataError(f"{self.path}: truncated at record {done}")
                chunk = np.frombuffer(raw, dtype=layout.dtype).reshape(take, layout.d)
                chunk = chunk.astype(np.float32 if layout.dtype == np.float32 else np.float64)
                _check_finite(chunk, self.path, done)
                yield chunk
                done += take

    def _csv_shape(self, fh, allow_empty: bool) -> tuple[bool, int]:
        """(whether the first line is a header, d): d from the first data row, or from the header
        of a file without records when ``allow_empty``."""
        first = fh.readline()
        header = not _numeric(first)
        row = first if not header and first.strip() else next((ln for ln in fh if ln.strip()), None)
        if row is not None:
            return header, len(row.split(","))
        if header and allow_empty:
            return header, len(first.split(","))
        raise DataError(f"{self.path}: no records")

    def _csv_chunks(self, check: bool) -> Iterator[np.ndarray]:
        done = 0
        with self._open("r") as fh:
            if self._header:
                fh.readline()
            while True:
                try:
                    with warnings.catch_warnings():  # "no data" at end of file is expected
                        warnings.simplefilter("ignore", UserWarning)
                        chunk = np.loadtxt(
                            fh, delimiter=",", dtype=np.float64, max_rows=self.rows, ndmin=2
                        )
                except ValueError as exc:
                    msg = str(exc).splitlines()[0]
                    raise DataError(f"{self.path}: malformed CSV near record {done}: {msg}") from None
                if chunk.shape[0] == 0:
                    return
                if chunk.shape[1] != self.d:
                    raise DataError(
                        f"{self.path}: record {done} has {chunk.shape[1]} columns, expected {self.d}"
                    )
                if check:
                    _check_finite(chunk, self.path, done)
                yield chunk
                done += chunk.shape[0]


def load_all(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a whole data file into one float32 (n, d) array (for evaluation and tests).

    DataError if a value lies beyond the float32 range (it would become ±inf)."""
    x = np.concatenate(list(DataSource(path).chunks()), axis=0)
    big = np.abs(x) > np.finfo(np.float32).max
    if big.any():
        row = int(np.argmax(big.any(axis=1)))
        raise DataError(f"{path}: record {row} holds a value beyond the float32 range")
    return x.astype(np.float32)


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
