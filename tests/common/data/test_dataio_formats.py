"""Reading the files people have: pandas' ``.npy`` (Fortran order), pandas' CSV (numeric header,
index column), Parquet by row group, ``--header/--no-header`` and ``--columns``, and places in
messages counted from 1."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedsketch.common.data.dataio import DataError, DataSource, ReadOptions, load_all

#: The records of the pandas frame below, and the files pandas writes from it (byte for byte:
#: test_these_are_the_bytes_pandas_writes), for machines without pandas.
X = np.array([[0.5, -1.25], [2.0, 3.0], [4.5, 5.0]])
PANDAS = {
    "to_csv(index=False)": ("0,1\n0.5,-1.25\n2.0,3.0\n4.5,5.0\n", X),
    "to_csv()": (",0,1\n0,0.5,-1.25\n1,2.0,3.0\n2,4.5,5.0\n", X),
    "iloc[::-1].to_csv()": (",0,1\n2,4.5,5.0\n1,2.0,3.0\n0,0.5,-1.25\n", X[::-1]),
    "reset_index().to_csv(index=False)": ("index,0,1\n0,0.5,-1.25\n1,2.0,3.0\n2,4.5,5.0\n", X),
    "read_csv(to_csv()).to_csv()": (",Unnamed: 0,0,1\n0,0,0.5,-1.25\n1,1,2.0,3.0\n2,2,4.5,5.0\n", X),
}


def _read(path, rows=7, **options) -> tuple[DataSource, list[np.ndarray]]:
    src = DataSource(path, rows=rows, options=ReadOptions(**options))
    chunks = list(src.chunks())
    assert all(0 < c.shape[0] <= rows for c in chunks)
    return src, chunks


def test_these_are_the_bytes_pandas_writes():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(X)
    io = pytest.importorskip("io")
    made = {
        "to_csv(index=False)": df.to_csv(index=False),
        "to_csv()": df.to_csv(),
        "iloc[::-1].to_csv()": df.iloc[::-1].to_csv(),
        "reset_index().to_csv(index=False)": df.reset_index().to_csv(index=False),
        "read_csv(to_csv()).to_csv()": pd.read_csv(io.StringIO(df.to_csv())).to_csv(),
    }
    assert made == {name: text for name, (text, _) in PANDAS.items()}


@pytest.mark.parametrize("dtype", ["<f4", "<f8", ">i8"])
def test_a_fortran_npy_reads_as_its_c_order_twin(tmp_path, dtype):
    x = (np.random.default_rng(1).normal(size=(53, 4)) * 100).astype(dtype)
    np.save(tmp_path / "c.npy", np.ascontiguousarray(x))
    np.save(tmp_path / "f.npy", np.asfortranarray(x))
    assert b"'fortran_order': True" in (tmp_path / "f.npy").read_bytes()[:128]
    c_src, c_chunks = _read(tmp_path / "c.npy")
    f_src, f_chunks = _read(tmp_path / "f.npy")
    assert [c.shape for c in f_chunks] == [c.shape for c in c_chunks]
    assert all(f.dtype == c.dtype for f, c in zip(f_chunks, c_chunks, strict=True))
    np.testing.assert_array_equal(np.concatenate(f_chunks), np.concatenate(c_chunks))
    np.testing.assert_array_equal(np.concatenate(f_chunks), x.astype(f_chunks[0].dtype))
    assert (f_src.n, f_src.d) == (53, 4) and "Fortran" in f_src.notes[0] and c_src.notes == ()


def test_pandas_to_numpy_is_read(tmp_path):
    pd = pytest.importorskip("pandas")
    values = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]}).to_numpy()
    assert values.flags.f_contiguous and not values.flags.c_contiguous
    np.save(tmp_path / "x.npy", values)
    np.testing.assert_array_equal(load_all(tmp_path / "x.npy"), [[1, 4], [2, 5], [3, 6]])


def test_a_fortran_npy_streams_in_bounded_memory(tmp_path):
    """8 MB of records read 1000 at a time: the pass never holds more than a few chunks."""
    np.save(tmp_path / "x.npy", np.asfortranarray(np.ones((250_000, 4))))
    src = DataSource(tmp_path / "x.npy", rows=1000)
    tracemalloc.start()
    try:
        total = sum(float(c.sum()) for c in src.chunks())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 1_000_000 and peak < 500_000  # one chunk: 32 kB; one column: 2 MB


def test_a_fortran_npy_names_records_and_columns_from_1(tmp_path):
    x = np.zeros((20, 3))
    x[5, 2] = np.nan
    np.save(tmp_path / "x.npy", np.asfortranarray(x))
    with pytest.raises(DataError, match=r"x.npy, record 6, column 3 holds a NaN"):
        _read(tmp_path / "x.npy", rows=4)


@pytest.mark.parametrize("how", list(PANDAS))
def test_pandas_csv_files_read_as_their_frame(tmp_path, how):
    text, expected = PANDAS[how]
    (tmp_path / "x.csv").write_text(text)
    src, chunks = _read(tmp_path / "x.csv", rows=2)
    np.testing.assert_array_equal(np.concatenate(chunks), expected)
    assert (src.n, src.d, src.columns) == (3, 2, ("0", "1"))
    said = " | ".join(src.notes)
    if how == "to_csv(index=False)":
        assert "line 1 (0,1) is taken as column names" in said
    if how in ("to_csv()", "iloc[::-1].to_csv()", "read_csv(to_csv()).to_csv()"):
        assert "column 1 has no name in the header: pandas' index column, not read" in said
    if how == "reset_index().to_csv(index=False)":
        assert "column 1 ('index') holds 0, 1, …, n−1: pandas' index column, not read" in said
    if how == "read_csv(to_csv()).to_csv()":
        assert "column 2 ('Unnamed: 0') holds 0, 1, …, n−1" in said


def test_a_column_named_index_that_is_not_0_to_n_minus_1_is_data(tmp_path):
    (tmp_path / "x.csv").write_text("index,a\n5,1\n6,2\n")
    src, chunks = _read(tmp_path / "x.csv")
    np.testing.assert_array_equal(np.concatenate(chunks), [[5, 1], [6, 2]])
    assert "does not hold 0, 1, …, n−1: read as data" in src.notes[0]


def test_a_one_column_file_starting_with_0_has_a_header_unless_told(tmp_path):
    path = _write(tmp_path / "x.csv", "0\n5\n7\n")
    src, _ = _read(path)
    assert (src.n, src.columns) == (2, ("0",)) and "line 1 (0) is taken as column names" in src.notes[0]
    assert _read(path, header=False)[0].n == 3


@pytest.mark.parametrize("first", ["1,2,3", "0,1,1", "0.0,1.0,2.0", "1,0,2", "0,1,2.5"])
def test_a_numeric_first_line_other_than_0_to_d_minus_1_is_a_record(tmp_path, first):
    (tmp_path / "x.csv").write_text(f"{first}\n7,8,9\n")
    src, chunks = _read(tmp_path / "x.csv")
    assert (src.n, src.columns, src.notes) == (2, None, ())
    np.testing.assert_array_equal(chunks[0][0], [float(v) for v in first.split(",")])


def test_no_header_reads_a_0_to_d_minus_1_line_as_a_record(tmp_path):
    (tmp_path / "x.csv").write_text(PANDAS["to_csv(index=False)"][0])
    src, chunks = _read(tmp_path / "x.csv", header=False)
    np.testing.assert_array_equal(np.concatenate(chunks), np.vstack([[0, 1], X]))
    assert (src.n, src.columns, src.notes) == (4, None, ())
    with pytest.raises(DataError, match=r"y.csv, line 1, column 1 holds 'a', which is not a number"):
        _read(_write(tmp_path / "y.csv", "a,b\n1,2\n"), header=False)


def test_header_takes_any_first_line_as_names(tmp_path):
    src, chunks = _read(_write(tmp_path / "x.csv", "1,2\n3,4\n5,6\n"), header=True)
    np.testing.assert_array_equal(np.concatenate(chunks), [[3, 4], [5, 6]])
    assert (src.n, src.columns) == (2, ("1", "2"))


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    """Excel's "CSV UTF-8" starts with U+FEFF: neither a first record nor a first name holds it."""
    (tmp_path / "x.csv").write_bytes(b"\xef\xbb\xbf1,2\n3,4\n")
    src, chunks = _read(tmp_path / "x.csv")
    assert src.n == 2 and src.columns is None
    (tmp_path / "y.csv").write_bytes(b"\xef\xbb\xbfa,b\n3,4\n")
    src, chunks = _read(tmp_path / "y.csv", columns=("a",))
    assert src.columns == ("a",) and chunks[0].tolist() == [[3.0]]


@pytest.mark.parametrize("sep, name", [(";", "semicolons"), ("\t", "tabs")])
def test_a_file_separated_by_another_character_says_so(tmp_path, sep, name):
    """Excel in a comma-decimal locale writes ';', a tab-separated .txt is common: the error says
    that the file looks separated by that character, not only that a field is no number."""
    path = _write(tmp_path / "x.csv", f"a{sep}b\n1.5{sep}2\n3{sep}4\n")
    with pytest.raises(DataError, match=rf"x.csv, line 2, column 1 \('a.{{1,2}}b'\) holds .*; the "
                                        rf"fields look separated by {name}, and fedsketch reads "
                                        "comma-separated files"):
        _read(path)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_file_is_named_as_such(tmp_path, encoding):
    """Excel's "Unicode Text" is UTF-16: refused as that, not as lines of odd widths."""
    path = tmp_path / "x.txt"
    path.write_bytes(("\ufeff" if encoding.endswith("be") else "").encode(encoding) +
                     "a,b\n1,2\n3,4\n".encode(encoding))
    with pytest.raises(DataError, match=r"x.txt: UTF-16 text; save it as UTF-8"):
        _read(path)


def test_quoted_numbers_read_as_numbers(tmp_path):
    """pandas' to_csv(quoting=csv.QUOTE_ALL) and database exports quote every field."""
    path = _write(tmp_path / "x.csv", '"a","b"\n"0.5","-1.25"\n"2.0",3\n')
    src, chunks = _read(path)
    np.testing.assert_array_equal(np.concatenate(chunks), [[0.5, -1.25], [2.0, 3.0]])
    assert src.columns == ("a", "b")
    with pytest.raises(DataError, match=r"x.csv, line 2, column 2 \('b'\) holds 'x', which is not a number"):
        _read(_write(tmp_path / "x.csv", '"a","b"\n"0.5","x"\n'))


def _write(path, text):
    path.write_text(text)
    return path


def test_csv_columns_by_name_in_their_order(tmp_path):
    path = _write(tmp_path / "x.csv", "id,a,b,c\nx1,1,2,3\nx2,4,5,6\n")
    src, chunks = _read(path, columns=("c", "a"))
    np.testing.assert_array_equal(np.concatenate(chunks), [[3, 1], [6, 4]])  # id never parsed
    assert (src.d, src.columns) == (2, ("c", "a"))
    with pytest.raises(DataError, match=r"has no column 'z' \(its columns: 'id', 'a', 'b', 'c'\)"):
        _read(path, columns=("z",))
    with pytest.raises(DataError, match=r"x.csv, line 3, column 4 \('c'\) holds a NaN"):
        _read(_write(path, "id,a,b,c\nx1,1,2,3\nx2,4,5,nan\n"), columns=("c", "a"))
    with pytest.raises(DataError, match="--columns names columns, but this file has no header"):
        _read(_write(tmp_path / "y.csv", "1,2\n"), columns=("a",))


def test_options_that_do_not_fit_the_file_are_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((2, 2)))
    for options in ({"header": True}, {"columns": ("a",)}):
        with pytest.raises(DataError, match="an .npy file has no header and no column names"):
            _read(tmp_path / "x.npy", **options)
    pq.write_table(pa.table({"a": [1.0]}), tmp_path / "x.parquet")
    with pytest.raises(DataError, match="--header/--no-header are for CSV files"):
        _read(tmp_path / "x.parquet", header=False)
    for text in ("a,,b", " "):
        with pytest.raises(DataError, match="--columns must be comma-separated column names"):
            ReadOptions.parse(None, text)
    with pytest.raises(DataError, match="--columns names 'a' more than once"):
        ReadOptions.parse(None, "a,b,a")
    assert ReadOptions.parse(False, " a, b") == ReadOptions(False, ("a", "b"))


def _parquet(path, n=35, group=10, **extra):
    rng = np.random.default_rng(2)
    table = pa.table({"a": rng.normal(size=n), "b": np.arange(n, dtype=np.int32),
                      "c": rng.normal(size=n).astype(np.float32),
                      "s": [f"name {i}" for i in range(n)], **extra})
    pq.write_table(table, path, row_group_size=group)
    return table


def test_parquet_streams_row_groups_in_chunks_of_the_named_columns(tmp_path):
    table = _parquet(tmp_path / "x.parquet")
    assert pq.ParquetFile(tmp_path / "x.parquet").num_row_groups == 4
    src, chunks = _read(tmp_path / "x.parquet", rows=4, columns=("c", "a", "b"))
    assert [c.shape[0] for c in chunks] == [4, 4, 2] * 3 + [4, 1]  # no chunk spans two row groups
    expected = np.column_stack([table["c"].to_numpy().astype(np.float64), table["a"].to_numpy(),
                                table["b"].to_numpy()])
    np.testing.assert_array_equal(np.concatenate(chunks), expected)
    assert chunks[0].dtype == np.float64 and (src.n, src.d, src.columns) == (35, 3, ("c", "a", "b"))
    _, single = _read(tmp_path / "x.parquet", rows=4, columns=("c",))
    assert single[0].dtype == np.float32  # float32 columns stay float32
    pq.write_table(pa.table({"p": pa.array([Decimal("1.25"), Decimal("-3.50")], pa.decimal128(5, 2)),
                             "q": pa.array([2**40, -7], pa.int64())}), tmp_path / "y.parquet")
    np.testing.assert_array_equal(load_all(tmp_path / "y.parquet"), [[1.25, 2.0**40], [-3.5, -7]])
    with pytest.raises(DataError, match=r"column 's' \(string\) does not hold numbers; choose numeric "
                                        r"columns with --columns"):
        DataSource(tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"has no column 'z' \(its columns: 'a', 'b', 'c', 's'\)"):
        DataSource(tmp_path / "x.parquet", options=ReadOptions(columns=("a", "z")))


def test_parquet_nulls_and_nans_are_named_by_record_and_column(tmp_path):
    nulls = pa.array([1.0] * 23 + [None] * 12)
    _parquet(tmp_path / "x.parquet", e=nulls)
    with pytest.raises(DataError, match=r"x.parquet, record 24, column 5 \('e'\) is null \(a missing "
                                        r"value\), which is not a number"):
        _read(tmp_path / "x.parquet", rows=4, columns=("a", "e"))
    a = np.zeros(35)
    a[12] = -np.inf
    pq.write_table(pa.table({"a": a}), tmp_path / "y.parquet", row_group_size=10)
    with pytest.raises(DataError, match=r"y.parquet, record 13, column 1 \('a'\) holds an infinity"):
        _read(tmp_path / "y.parquet", rows=4)


def test_parquet_from_pandas_leaves_its_stored_index_out(tmp_path):
    pd = pytest.importorskip("pandas")
    pd.DataFrame(X, columns=["a", "b"], index=[10, 11, 12]).to_parquet(tmp_path / "x.parquet")
    src, chunks = _read(tmp_path / "x.parquet")
    np.testing.assert_array_equal(np.concatenate(chunks), X)
    assert src.columns == ("a", "b") and "'__index_level_0__' is pandas' stored index" in src.notes[0]


def test_a_parquet_source_never_reads_another_version_of_its_file(tmp_path):
    _parquet(tmp_path / "x.parquet")
    src = DataSource(tmp_path / "x.parquet", options=ReadOptions(columns=("a",)))
    time.sleep(0.01)
    _parquet(tmp_path / "new.parquet", n=40)
    (tmp_path / "new.parquet").replace(tmp_path / "x.parquet")
    with pytest.raises(DataError, match="changed while it was in use"):
        list(src.chunks())


def test_parquet_streams_in_bounded_memory(tmp_path):
    """16 MB of records in row groups of 0.5 MB: Arrow's peak allocation while a fresh process
    reads them stays near one row group (the whole table would be 16 MB)."""
    pq.write_table(pa.table({"a": np.ones(1_000_000), "b": np.zeros(1_000_000)}),
                   tmp_path / "x.parquet", row_group_size=32_768)
    script = ("import sys, pyarrow as pa; from fedsketch.common.data.dataio import DataSource\n"
              "n = sum(c.shape[0] for c in DataSource(sys.argv[1], rows=4096).chunks())\n"
              "print(n, pa.default_memory_pool().max_memory())")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "x.parquet")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) == 1_000_000 and int(out[1]) < 4_000_000, out
