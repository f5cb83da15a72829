"""Streaming reader of Parquet files (Apache Arrow's ``pyarrow``), one row group at a time.

Every column read must hold numbers: integers, floats or decimals (read as float64; float32 when
every column read is float32). A column of another type (strings, dates, booleans, lists) is
refused by name when the file is opened, with the hint to choose columns with ``--columns``;
a null (missing value) is refused by record and column when a pass reaches it.

Without ``--columns`` every column is read, except the index columns pandas stored with
``DataFrame.to_parquet`` (listed in the file's pandas metadata; the reader says so).

Memory is one row group of the columns read plus one chunk: row group g is read whole (Parquet
compresses a row group's column chunks as units), then handed out in blocks of ≤ ``rows``
records. Writers bound a row group (pyarrow: 1 Mi rows by default; Spark and pandas: 128 MiB).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .dataformat import Block, DataError, ReadOptions, column_label


@dataclass(frozen=True)
class ParquetLayout:
    """What a pass reads: ``columns`` (names, in the records' column order), their ``labels``,
    n records, the Arrow ``schema`` of the file (a pass refuses a file whose schema changed), the
    output ``dtype``, and ``notes`` for the user."""

    columns: tuple[str, ...]
    labels: tuple[str, ...]
    n: int
    schema: pa.Schema
    dtype: type
    notes: tuple[str, ...] = ()

    @property
    def d(self) -> int:
        return len(self.columns)


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _open(fh: BinaryIO, path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(fh)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a valid Parquet file ({str(exc).splitlines()[0]})") from None


def parquet_layout(fh: BinaryIO, path: Path, options: ReadOptions) -> ParquetLayout:
    """The layout of the Parquet file open as ``fh``."""
    if options.header is not None:
        raise DataError(f"{path}: --header/--no-header are for CSV files; a Parquet file names its "
                        "columns itself")
    pf = _open(fh, path)
    schema = pf.schema_arrow
    names = schema.names
    notes: tuple[str, ...] = ()
    if options.columns is not None:
        missing = [name for name in options.columns if name not in names]
        if missing:
            raise DataError(f"{path} has no column {', '.join(map(repr, missing))} (its columns: "
                            f"{', '.join(map(repr, names[:20]))}{', …' if len(names) > 20 else ''})")
        columns = options.columns
    else:
        index = [c for c in (schema.pandas_metadata or {}).get("index_columns", [])
                 if isinstance(c, str) and c in names]
        columns = tuple(name for name in names if name not in index)
        if index:
            notes = (f"column {', '.join(map(repr, index))} is pandas' stored index, not read "
                     "(--columns chooses columns)",)
    bad = [f"{name!r} ({schema.field(name).type})" for name in columns
           if not _numeric(schema.field(name).type)]
    if bad:
        raise DataError(f"{path}: column {', '.join(bad)} does not hold numbers; choose numeric "
                        "columns with --columns")
    if not columns:
        raise DataError(f"{path}: no columns to read")
    labels = tuple(column_label(names.index(name) + 1, name) for name in columns)
    single = all(schema.field(name).type == pa.float32() for name in columns)
    return ParquetLayout(columns, labels, pf.metadata.num_rows, schema,
                         np.float32 if single else np.float64, notes)


def parquet_blocks(fh: BinaryIO, path: Path, layout: ParquetLayout, rows: int) -> Iterator[Block]:
    """The records of the file open as ``fh``, row group by row group, in blocks of ≤ ``rows``."""
    pf = _open(fh, path)
    if pf.schema_arrow != layout.schema or pf.metadata.num_rows != layout.n:
        raise DataError(f"{path} changed while it was in use (another layout); it is opened afresh "
                        "for the next study")
    done = 0
    for g in range(pf.num_row_groups):
        table = pf.read_row_group(g, columns=list(layout.columns))
        for start in range(0, table.num_rows, rows):
            part = table.slice(start, rows)
            x = np.empty((part.num_rows, layout.d), dtype=layout.dtype)
            for j, name in enumerate(layout.columns):
                col = part.column(name)
                if col.null_count:
                    block = Block(x, done, None, layout.labels)
                    i = int(np.argmax(pc.is_null(col).to_numpy(zero_copy_only=False)))
                    raise DataError(f"{path}, {block.where(i, j)} is null (a missing value), which "
                                    "is not a number; fill or drop that record")
                if pa.types.is_decimal(col.type):
                    col = col.cast(pa.float64())
                x[:, j] = col.to_numpy()
            yield Block(x, done, None, layout.labels)
            done += part.num_rows
