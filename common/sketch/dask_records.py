"""A device's records spread over a cluster: a partitioned Parquet dataset (a folder of
``.parquet``/``.pq`` files, one partition each) sketched where it lies with Dask
(``dask.distributed``, the ``dask`` extra).

Each partition's exact integer feature sum

    S_p = Σ_{i ∈ p} q(Ωᵀ(clip(x_i) − c) + ξ') ⊙ b_i   ∈ Z^m + iZ^m   (grid steps)

is computed on a worker by the same code as the single-process path (the partition read as a
:class:`~fedsketch.common.data.dataio.DataSource`, so every reading rule holds: numeric columns
only, no null, no NaN or infinity; clipped into the public box, centred, then
:func:`~fedsketch.common.sketch.sketching.feature_sum`). The device adds the integers,
S = Σ_p S_p, exactly (int64), together with the record count n = Σ_p n_p and the clipped count,
and releases once, on the device itself, with one noise draw (:func:`~.privacy.privatize`): the
workers see the data and Ω, never the noise. With r = m (no masks) S is the single-process S,
integer for integer; with r < m the masks are drawn on each worker from its OS CSPRNG (public,
data-independent), as a single process draws them.

The folder must be readable at the same path by the device and by every worker (a shared file
system): the device lists the partitions and reads their metadata (n, d, the columns) before
anything is spent, and a worker refuses a partition whose record count or dimension changed
since (a file rewritten while in use).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..data.dataformat import AS_IS, DataError, ReadOptions
from ..data.dataio import CHUNK_ROWS, PARQUET, DataSource
from .box import Box, Tally
from .sketching import FeatureSum, PhaseOperator, feature_sum

#: Engines that sum a dataset's features: in this process, or on a Dask cluster.
ENGINES: tuple[str, ...] = ("local", "dask")


def partition_files(folder: Path) -> list[Path]:
    """The Parquet files directly in ``folder``, in name order; DataError for a folder that holds
    none (or is not a folder)."""
    if not folder.is_dir():
        raise DataError(f"{folder}: --engine dask reads a folder of Parquet files (one partition "
                        "each), not a file")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in PARQUET)
    if not files:
        raise DataError(f"{folder}: no .parquet or .pq file in this folder")
    return files


def partition_sum(path: str, n: int, d: int, options: ReadOptions, freqs: PhaseOperator,
                  feature: str, r: int, box: Box, rows: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(records, clipped, Re S_p, Im S_p) of one partition, on a worker (module docstring);
    DataError if the partition no longer holds ``n`` records of dimension ``d``."""
    source = DataSource(path, rows, allow_empty=True, options=options)
    if (source.n, source.d) != (n, d):
        raise DataError(f"{path} changed while it was in use ({source.n} records of d = "
                        f"{source.d}, listed as {n} of d = {d})")
    tally = Tally()
    fs = feature_sum(box.centred(source.chunks(), tally), freqs, feature, r, workers=1)
    return fs.n, tally.clipped, fs.re, fs.im


class DaskRecords:
    """The records of a partitioned Parquet dataset (module docstring), summed on the Dask cluster
    at ``scheduler`` (an address such as ``tcp://10.0.0.5:8786``; None: a local cluster of one
    single-threaded worker process per core, started and stopped for each sum).

    ``n`` and ``d`` are known after construction, from the partitions' metadata; ``columns`` and
    ``notes`` as for a :class:`~fedsketch.common.data.dataio.DataSource` (``options`` apply to
    every partition, which must all read as the same columns). Pass the object where a sketch
    takes its records' chunks: :meth:`feature_sum` computes the sum where the data lie.
    """

    def __init__(self, folder: str | os.PathLike[str], *, scheduler: str | None = None,
                 options: ReadOptions = AS_IS, rows: int = CHUNK_ROWS) -> None:
        self.folder = Path(folder)
        self.scheduler = scheduler
        self.options = options
        self.rows = int(rows)
        sources = [DataSource(p, rows, allow_empty=True, options=options)
                   for p in partition_files(self.folder)]
        first = sources[0]
        for other in sources[1:]:
            if (other.d, other.columns) != (first.d, first.columns):
                raise DataError(f"{other.path}: columns {other.columns or other.d} differ from "
                                f"{first.path}'s {first.columns or first.d}; every partition "
                                "must hold the same columns")
        self.partitions = [(str(s.path), s.n) for s in sources]
        self.n, self.d = sum(s.n for s in sources), first.d
        self.columns = first.columns
        self.notes = tuple(dict.fromkeys(note for s in sources for note in s.notes))
        if self.n == 0:
            raise DataError(f"{self.folder}: no records in any partition")

    def chunks(self) -> DaskRecords:
        """The records as a sketch takes them (:func:`~.sketching.sum_records`): this object,
        whose :meth:`feature_sum` runs on the cluster."""
        return self

    def feature_sum(self, freqs: PhaseOperator, feature: str, r: int | None, box: Box,
                    tally: Tally | None = None,
                    progress: Callable[[int], None] | None = None) -> FeatureSum:
        """S = Σ_p S_p over every partition (module docstring); ``progress(rows)`` as each
        partition's sum arrives, the counts to ``tally``."""
        from dask.distributed import as_completed

        m = freqs.omega.shape[1]
        r = m if r is None else r
        if box.d != self.d:
            raise ValueError(f"records have dimension {self.d}, the box has {box.d}")
        re, im, n = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64), 0
        with self._client() as client:
            futures = [client.submit(partition_sum, path, rows, self.d, self.options, freqs, feature,
                                     r, box, self.rows, pure=False)
                       for path, rows in self.partitions]
            for future in as_completed(futures):
                rows, clipped, part_re, part_im = future.result()
                re += part_re
                im += part_im
                n += rows
                if tally is not None:
                    tally.records += rows
                    tally.clipped += clipped
                if progress is not None:
                    progress(rows)
        return FeatureSum(feature, m, r, n, re, im)

    @contextmanager
    def _client(self) -> Iterator:
        """A client of the cluster at ``scheduler``, or of a local cluster made for this sum."""
        from dask.distributed import Client, LocalCluster

        if self.scheduler is not None:
            with Client(self.scheduler) as client:
                yield client
            return
        with LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            yield client


def open_records(path: Path, engine: str, scheduler: str | None, options: ReadOptions,
                 opener: Callable[[], DataSource]) -> DataSource | DaskRecords:
    """The records at ``path`` as ``--engine`` says: a :class:`DataSource` read here (``local``,
    made by ``opener``), or a :class:`DaskRecords` summed on the cluster (``dask``). ValueError
    for an unknown engine or a scheduler without ``dask``."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "local":
        if scheduler is not None:
            raise ValueError("--scheduler is for --engine dask")
        return opener()
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        raise ValueError("--engine dask needs the dask extra: pip install 'fedsketch[dask]'") from None
    if scheduler is not None:
        check_scheduler(scheduler)
    return DaskRecords(path, scheduler=scheduler, options=options)


def check_scheduler(scheduler: str, seconds: float = 10.0) -> None:
    """ValueError in words unless a client connects to the Dask scheduler at ``scheduler``
    within ``seconds``: checked once when the records are opened (the daemon's start), not at
    the first sum, where a bad address was retried every pass and a ``tls://`` address without
    Dask's TLS settings (``DASK_DISTRIBUTED__COMM__TLS__*``) declined the study for good."""
    from dask.distributed import Client

    try:
        Client(scheduler, timeout=seconds).close()
    except (OSError, ValueError, TypeError) as exc:  # unreachable, malformed, TLS unset
        raise ValueError(f"cannot reach the Dask scheduler at {scheduler!r}: {exc}") from None
