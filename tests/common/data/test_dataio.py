"""Chunked data reading and its refusals."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from fedsketch.common.data import dataio
from fedsketch.common.data.dataio import DataError, DataSource, load_all, write_npy_stream


def _chunks_equal(path, expected, rows=7, dtype=np.float64):
    src = DataSource(path, rows=rows)
    chunks = list(src.chunks())
    assert all(c.shape[0] <= rows and c.dtype == dtype for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), expected.astype(dtype))
    assert (src.n, src.d) == expected.shape


@pytest.mark.parametrize("dtype", ["<f4", "<f8", ">f8", "<i4"])
def test_npy_roundtrip_in_chunks(tmp_path, dtype):
    x = (np.arange(60).reshape(20, 3) - 7).astype(dtype)
    np.save(tmp_path / "x.npy", x)
    # float32 files stay float32; every other dtype is read at float64, without loss
    _chunks_equal(tmp_path / "x.npy", x, dtype=np.float32 if dtype == "<f4" else np.float64)


def test_values_beyond_float32_reach_the_reader_intact(tmp_path):
    """A finite float64 value beyond the float32 range is read as it is (the box clips it later);
    load_all, which returns float32, refuses it rather than turning it into inf."""
    x = np.array([[1.0, 2.0], [1e300, -1e39]])
    np.save(tmp_path / "x.npy", x)
    np.testing.assert_array_equal(np.concatenate(list(DataSource(tmp_path / "x.npy").chunks())), x)
    with pytest.raises(DataError, match=r"record 2, column 1 holds 1e\+300, beyond the float32 range"):
        load_all(tmp_path / "x.npy")


def test_one_dimensional_npy_is_one_column(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(5.0))
    assert DataSource(tmp_path / "x.npy").d == 1


def test_csv_with_and_without_header(tmp_path):
    x = np.random.default_rng(0).normal(size=(23, 4))
    np.savetxt(tmp_path / "a.csv", x, delimiter=",")
    np.savetxt(tmp_path / "b.csv", x, delimiter=",", header="a,b,c,d", comments="")
    _chunks_equal(tmp_path / "a.csv", x)
    _chunks_equal(tmp_path / "b.csv", x)


def test_write_npy_stream(tmp_path):
    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    write_npy_stream(tmp_path / "s.npy", 10, 3, iter([x[:4], x[4:]]))
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), x)
    with pytest.raises(RuntimeError):
        write_npy_stream(tmp_path / "t.npy", 11, 3, iter([x]))
    assert not list(tmp_path.glob("*t.npy*"))  # no partial file left


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: np.save(p / "x.npy", np.array([[1.0, np.nan]])), "x.npy, record 1, column 2 holds a NaN"),
        (lambda p: np.save(p / "x.npy", np.array([[1.0, 2.0], [np.inf, 0]])),
         r"x.npy, record 2, column 1 holds an infinity \(inf\)"),
        (lambda p: (p / "x.npy").write_bytes(b""), "empty file"),
        (lambda p: np.save(p / "x.npy", np.zeros((0, 3))), "no records"),
        (lambda p: np.save(p / "x.npy", np.zeros((2, 2, 2))), "expected a 2-D array"),
        (lambda p: np.save(p / "x.npy", np.array([["a", "b"]])), "not a real numeric"),
        (lambda p: (p / "x.npy").write_bytes(b"not numpy at all"), "not a valid .npy"),
        (lambda p: (p / "x.csv").write_text("1,2\n3,\n"),
         r"x.csv, line 2, column 2 is empty \(a missing value\)"),
        (lambda p: (p / "x.csv").write_text("1,2\n3,4,5\n"),
         r"x.csv, line 2: 3 fields, but the first record \(line 1\) has 2"),
        (lambda p: (p / "x.csv").write_text("a,b,c\n1,2,3\n\n# note\n4,5x,6\n"),
         r"x.csv, line 5, column 2 \('b'\) holds '5x', which is not a number"),
        (lambda p: (p / "x.csv").write_text("a,b\n"), "no records"),
        (lambda p: (p / "x.csv").write_text("1,nan\n"), "x.csv, line 1, column 2 holds a NaN"),
        (lambda p: (p / "x.csv").write_text("a,b\n\n1,2\n-inf,0\n"),
         r"x.csv, line 4, column 1 \('a'\) holds an infinity"),
        (lambda p: (p / "x.parquet").write_text("x"), "x.parquet: not a valid Parquet file"),
        (lambda p: (p / "x.xlsx").write_text("x"), "unknown data format"),
    ],
)
def test_bad_files_are_refused(tmp_path, make, message):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(DataError, match=message):
        load_all(path)


def test_truncated_npy(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((100, 3)))
    raw = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(raw[:-8])
    with pytest.raises(DataError, match="truncated"):
        DataSource(tmp_path / "x.npy")


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        DataSource(tmp_path / "nope.npy")
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(DataError, match="folder.csv: a folder, not a data file"):
        DataSource(tmp_path / "folder.csv")


@pytest.mark.parametrize("suffix", [".npy", ".csv"])
def test_a_source_never_reads_another_version_of_its_file(tmp_path, suffix):
    """Replaced (rename over it: another inode) or rewritten in place (another size or time), the
    file is refused by the source that opened the old version; a new source reads the new one."""
    path = tmp_path / f"x{suffix}"

    def write(x, target=path):
        if suffix == ".npy":
            np.save(target, x)
        else:
            np.savetxt(target, x, delimiter=",")

    write(np.zeros((5, 2), np.float32))
    old = DataSource(path)
    assert sum(c.shape[0] for c in old.chunks()) == 5
    write(np.ones((7, 3)), tmp_path / f"new{suffix}")
    (tmp_path / f"new{suffix}").replace(path)
    with pytest.raises(DataError, match="changed while it was in use"):
        list(old.chunks())
    new = DataSource(path)
    assert (new.n, new.d) == (7, 3) and np.all(np.concatenate(list(new.chunks())) == 1)
    with open(path, "ab") as fh:  # in place: same inode, other size
        fh.write(b"\n" if suffix == ".csv" else b"\0" * 8)
    with pytest.raises(DataError, match="changed while it was in use"):
        list(new.chunks())


def test_a_rewrite_that_keeps_size_and_mtime_is_still_seen(tmp_path, monkeypatch):
    """In place, same size, mtime restored (`cp -p`, `touch -r`): the status-change time shows
    it; and should the stamp ever miss, an .npy pass compares the header it opened with."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((10, 4), np.float32))
    before = os.stat(path)
    src = DataSource(path)
    time.sleep(0.01)
    with open(path, "r+b") as fh:  # same inode, size and header; other records
        np.save(fh, np.ones((10, 4), np.float32))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size
    with pytest.raises(DataError, match="changed while it was in use"):
        list(src.chunks())
    monkeypatch.setattr(dataio, "_stamp", lambda st: ())  # a stamp that sees nothing
    np.save(path, np.zeros((10, 4), np.float32))
    blind = DataSource(path)
    with open(path, "r+b") as fh:
        np.save(fh, np.ones((20, 2), np.float32))
    with pytest.raises(DataError, match="another header"):
        list(blind.chunks())


def test_a_file_changed_during_a_pass_fails_that_pass(tmp_path):
    """The stamp is checked again after the last chunk: a pass that read a file while it was
    rewritten does not count."""
    path = tmp_path / "x.csv"
    np.savetxt(path, np.zeros((50, 2)), delimiter=",")
    src = DataSource(path, rows=10)
    chunks = src.chunks()
    next(chunks)
    time.sleep(0.01)
    with open(path, "a") as fh:
        fh.write("1,1\n")
    with pytest.raises(DataError, match="changed while it was in use"):
        list(chunks)


def test_an_empty_file_is_accepted_only_when_asked(tmp_path):
    """allow_empty (the device daemon under add/remove): shape (0, d), or a CSV header alone."""
    np.save(tmp_path / "x.npy", np.zeros((0, 3)))
    (tmp_path / "x.csv").write_text("a,b\n")
    for name, d in (("x.npy", 3), ("x.csv", 2)):
        with pytest.raises(DataError, match="no records"):
            DataSource(tmp_path / name)
        src = DataSource(tmp_path / name, allow_empty=True)
        assert (src.n, src.d) == (0, d) and list(src.chunks()) == []
