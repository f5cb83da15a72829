"""Streaming reader of CSV files: one record a line, numbers separated by commas.

Blank lines and lines starting with ``#`` are skipped. The first other line is either a header
(column names) or the first record:

- ``--header`` / ``--no-header`` (:class:`~fedsketch.common.data.dataformat.ReadOptions`) decide it;
- otherwise it is a header when one of its fields is not a number, **or** when its fields are
  exactly ``0,1,…,d−1`` (what pandas writes as the header of a frame without column names, e.g.
  ``df.to_csv(index=False)``). A first record that is exactly 0, 1, …, d−1 is thus taken as a
  header: the reader says so (:attr:`CsvLayout.notes`), and ``--no-header`` reads it as a record.
  Any other all-number line (``1,2,3``, ``0,1,1``, ``0.0,1.0``) is a record.

pandas' index column (``df.to_csv()`` writes the row labels first) is dropped, and the reader
says so: a first column whose header cell is empty (always: no data column is unnamed), then a
leading column named ``index`` or ``Unnamed: 0`` (``reset_index()``; a CSV read back and written
again) if it holds exactly 0, 1, …, n−1. Without a header nothing is dropped. ``--columns a,b``
reads the named columns of a file with a header, in that order, and drops nothing else.

Memory is O(rows·D) for a file of D columns: lines are read ``rows`` at a time and parsed by
NumPy's C parser. Messages name the line of the file and its column, both from 1.
"""

from __future__ import annotations

import csv
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import numpy as np

from .dataformat import Block, DataError, ReadOptions, column_label

#: Names pandas gives a column that holds row labels: ``reset_index()``, and ``read_csv`` of a
#: file written with its index.
INDEX_NAMES = ("index", "Unnamed: 0")


@dataclass(frozen=True)
class CsvLayout:
    """How a CSV file is read: ``names`` (its header, or None: the first line is a record),
    ``line`` (the file line, from 1, of that header or first record), ``width`` (fields a line),
    ``usecols`` (the file columns read, from 0, in the order of the records' columns) and
    ``notes`` (what the reader decided, for the user)."""

    names: tuple[str, ...] | None
    line: int
    width: int
    usecols: tuple[int, ...]
    notes: tuple[str, ...] = ()

    @property
    def d(self) -> int:
        return len(self.usecols)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(column_label(c + 1, None if self.names is None else self.names[c])
                     for c in self.usecols)


Opener = Callable[[], AbstractContextManager[TextIO]]


def csv_layout(open_file: Opener, path: Path, options: ReadOptions, rows: int) -> tuple[CsvLayout, int]:
    """The layout of the CSV file ``open_file()`` opens, and its number of records n (counted by
    a full pass that also parses every record, so a malformed line is found before any use)."""
    with open_file() as fh:
        line, first = next(((no, text) for no, text in enumerate(fh, start=1)
                            if text.strip() and not text.lstrip().startswith("#")), (0, ""))
    if not line:
        raise DataError(f"{path}: no records")
    fields = [field.strip() for field in next(csv.reader([first]))]
    header, notes = _is_header(fields, options.header, line)
    names = tuple(fields) if header else None
    layout = CsvLayout(names, line, len(fields), tuple(range(len(fields))), notes)
    candidate = None
    if options.columns is not None:
        layout = replace(layout, usecols=_named(path, names, options.columns))
    elif names is not None:
        layout, candidate = _index_columns(layout)
    n, is_index = 0, candidate is not None
    with open_file() as fh:
        for block in csv_blocks(fh, path, layout, rows):
            if is_index:
                col = block.x[:, layout.usecols.index(candidate)]
                is_index = bool(np.array_equal(col, np.arange(n, n + col.shape[0])))
            n += block.x.shape[0]
    if candidate is not None:
        name = f"column {candidate + 1} ({layout.names[candidate]!r})"
        if is_index and n:
            layout = replace(layout, usecols=tuple(c for c in layout.usecols if c != candidate),
                             notes=layout.notes + (f"{name} holds 0, 1, …, n−1: pandas' index "
                                                   "column, not read (--columns chooses columns)",))
        else:
            layout = replace(layout, notes=layout.notes + (
                f"{name} is named like pandas' index column but does not hold 0, 1, …, n−1: read "
                "as data (--columns chooses columns)",))
    return layout, n


def _is_header(fields: list[str], forced: bool | None, line: int) -> tuple[bool, tuple[str, ...]]:
    """Whether the first line is a header (module docstring), and the note that says why."""
    if forced is not None:
        return forced, ()
    if not all(_number(field) for field in fields):
        return True, ()
    if fields == [str(j) for j in range(len(fields))]:
        return True, (f"line {line} ({','.join(fields[:3])}{',…' if len(fields) > 3 else ''}) is "
                      "taken as column names, as pandas writes them for a frame without names; "
                      "--no-header reads it as a record",)
    return False, ()


#: Separators of files that are not comma-separated, named in the error a field holding one gets.
OTHER_SEPARATORS = ((";", "semicolons"), ("\t", "tabs"))


def _number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _named(path: Path, names: tuple[str, ...] | None, wanted: tuple[str, ...]) -> tuple[int, ...]:
    """The file columns (from 0) that ``--columns`` names, in its order."""
    if names is None:
        raise DataError(f"{path}: --columns names columns, but this file has no header line (its "
                        "first line is a record, or --no-header was given)")
    found = []
    for name in wanted:
        where = [c for c, have in enumerate(names) if have == name]
        if len(where) != 1:
            shown = ", ".join(repr(have) for have in names[:20]) + (", …" if len(names) > 20 else "")
            problem = "has no column" if not where else f"has {len(where)} columns named"
            raise DataError(f"{path} {problem} {name!r} (its columns: {shown})")
        found.append(where[0])
    return tuple(found)


def _index_columns(layout: CsvLayout) -> tuple[CsvLayout, int | None]:
    """``layout`` without a first column of empty name, and the column (from 0) that is pandas'
    index if it holds 0..n−1 (None if there is no such candidate)."""
    names, start, notes = layout.names or (), 0, layout.notes
    if names and names[0] == "":
        start = 1
        notes += ("column 1 has no name in the header: pandas' index column, not read (--columns "
                  "chooses columns)",)
    usecols = tuple(range(start, layout.width))
    candidate = start if start < len(names) and names[start] in INDEX_NAMES else None
    return replace(layout, usecols=usecols, notes=notes), candidate


def csv_blocks(fh: TextIO, path: Path, layout: CsvLayout, rows: int) -> Iterator[Block]:
    """The records of the file open as ``fh`` (at its start), in blocks of ≤ ``rows`` records
    (float64), each with the file line of every record."""
    skip = layout.line if layout.names is not None else 0
    labels = layout.labels
    lines: list[str] = []
    numbers: list[int] = []
    done = 0
    for no, text in enumerate(fh, start=1):
        if no <= skip or not text.strip() or text.lstrip().startswith("#"):
            continue
        lines.append(text)
        numbers.append(no)
        if len(lines) == rows:
            yield Block(_parse(path, layout, lines, numbers), done, tuple(numbers), labels)
            done += len(lines)
            lines, numbers = [], []
    if lines:
        yield Block(_parse(path, layout, lines, numbers), done, tuple(numbers), labels)


def _parse(path: Path, layout: CsvLayout, lines: list[str], numbers: list[int]) -> np.ndarray:
    """The records of ``lines`` (file lines ``numbers``) as a float64 array; DataError naming the
    first line of another width or the first field that is not a number."""
    for text, no in zip(lines, numbers, strict=True):
        width = text.split("#", 1)[0].count(",") + 1 if "#" in text else text.count(",") + 1
        if width != layout.width:
            first = "the header" if layout.names is not None else "the first record"
            raise DataError(f"{path}, line {no}: {width} fields, but {first} (line {layout.line}) "
                            f"has {layout.width}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return np.loadtxt(lines, delimiter=",", dtype=np.float64, usecols=layout.usecols,
                              ndmin=2, comments="#", quotechar='"')
    except ValueError:
        pass
    labels = layout.labels
    for text, no in zip(lines, numbers, strict=True):
        fields = text.split("#", 1)[0].split(",")
        for j, c in enumerate(layout.usecols):
            field = fields[c].strip()
            field = field[1:-1] if len(field) > 1 and field[0] == field[-1] == '"' else field
            if not _number(field):
                what = "is empty (a missing value)" if not field else f"holds {field[:40]!r}"
                fix = next((f"the fields look separated by {name}, and fedsketch reads comma-separated "
                            "files: save it with commas" for sep, name in OTHER_SEPARATORS if sep in field),
                           "fix or drop that line")
                raise DataError(f"{path}, line {no}, {labels[j]} {what}, which is not a number; {fix}")
    raise DataError(f"{path}, lines {numbers[0]}–{numbers[-1]}: cannot be read as numbers")
