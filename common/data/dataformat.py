"""What the data readers (:mod:`.npyio`, :mod:`.csvio`, :mod:`.parquetio`) share: the error they
raise, the options a user gives them, and the block of records each yields with where it lies.

Places in messages are counted from 1, as a user sees them: a CSV names the **line of the file**
(the header and blank lines counted, as an editor numbers them) and the column of the file (an
index column counted); an ``.npy`` or a Parquet file, which have no lines, names the **record**
(the n-th record of the file) and the column (by position, and by name where the file has names).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DataError(ValueError):
    """A data file that cannot be used as it is (missing, empty, malformed, non-finite)."""


@dataclass(frozen=True)
class ReadOptions:
    """How to read a data file, as the user gave it (``--header/--no-header``, ``--columns``).

    ``header``: for CSV only; True takes the first line as column names, False as a record, None
    decides from its content (:func:`fedsketch.common.data.csvio.csv_layout`).
    ``columns``: the columns to read, by name and in this order (a CSV with a header, or Parquet);
    None reads every column (a CSV's pandas index column dropped)."""

    header: bool | None = None
    columns: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, header: bool | None, columns: str | None) -> ReadOptions:
        """From the command line: ``columns`` is comma-separated names ("a,b,c"), or None."""
        if columns is None:
            return cls(header, None)
        names = tuple(name.strip() for name in columns.split(","))
        if not all(names):
            raise DataError(f"--columns must be comma-separated column names, got {columns!r}")
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise DataError(f"--columns names {', '.join(map(repr, twice))} more than once")
        return cls(header, names)


#: Read a file as its content says (header detected, every column, pandas' index dropped).
AS_IS = ReadOptions()


def column_label(position: int, name: str | None) -> str:
    """A column for a message: its position in the file from 1, and its name if it has one."""
    return f"column {position}" if name is None else f"column {position} ({name!r})"


@dataclass(frozen=True)
class Block:
    """Up to ``rows`` records read from a file, and where each lies in it.

    ``x``: (t, d) records; ``first``: how many records of the file precede them; ``lines``: for a
    CSV, the file line (from 1) of each record, else None; ``labels``: each column of ``x`` as
    :func:`column_label` names it."""

    x: np.ndarray
    first: int
    lines: tuple[int, ...] | None
    labels: tuple[str, ...]

    def where(self, i: int, j: int | None = None) -> str:
        """Record ``i`` of the block (and column ``j`` of ``x``) as a user finds it in the file."""
        row = f"line {self.lines[i]}" if self.lines is not None else f"record {self.first + i + 1}"
        return row if j is None else f"{row}, {self.labels[j]}"
