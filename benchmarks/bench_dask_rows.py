"""A device bigger than one machine: the feature sum of ``--rows`` records (10^8 by default) in a
Parquet folder, on a Dask ``LocalCluster`` against the single-process reader.

The records (d = ``--d`` (10), float32, N(0, 3²) per axis, seeded) are written once into
``--folder`` as partitions of ``--part-rows`` (10^6) rows each, and kept for later runs. Both
paths compute S over every record clipped into the box ±12 with m = ``--m`` (1000), the complex
map and r = ``--r`` (1, every command's default; r = m makes the same integers on both paths,
which tests/common/sketch/test_dask_records.py checks, at m times the work):

single: one process reads the partitions one after another (``DataSource`` chunks) and sums them
    with ``feature_sum``'s thread pool on every core, as ``fedsketch sketch`` does; run in a child
    process, so its peak resident set (VmHWM) is its own.
dask: ``DaskRecords`` on a LocalCluster of ``--workers`` (2) single-threaded worker processes,
    each partition's exact integer sum on a worker, added on the device; the peak resident set
    of each worker and of the device.

Prints one JSON line per path: records, seconds, records/s, peak resident sets (bytes), and the
load average before and after (the machine is shared: say so with the numbers).

Usage: nice -n 15 python benchmarks/bench_dask_rows.py --folder DIR [--rows 100000000]
           [--part-rows 1000000] [--workers 2] [--m 1000] [--r 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fedsketch.common.data.dataio import DataSource
from fedsketch.common.sketch.box import Box, Tally
from fedsketch.common.sketch.dask_records import DaskRecords, partition_files
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.server.sim.ray_devices import peak_rss_bytes

BOUND = 12.0


def write_folder(folder: Path, rows: int, part_rows: int, d: int) -> None:
    """The partitions of ``rows`` records, ``part-NNNNN.parquet``; kept if already there."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, rows, part_rows)):
        path = folder / f"part-{i:05d}.parquet"
        if path.exists():
            continue
        x = (np.random.default_rng(i).normal(size=(min(part_rows, rows - start), d)) * 3).astype(np.float32)
        pq.write_table(pa.table({f"x{j}": x[:, j] for j in range(d)}), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)


def operator(d: int, m: int) -> tuple[Box, object]:
    box = Box([-BOUND] * d, [BOUND] * d)
    return box, box.reduce(draw_frequencies(FrequencySpec(d=d, m=m, seed=0, scale=2.0)))


def single(folder: Path, d: int, m: int, r: int) -> dict:
    box, freqs = operator(d, m)
    t = time.perf_counter()
    chunks = chain.from_iterable(DataSource(p).chunks() for p in partition_files(folder))
    fs = feature_sum(box.centred(chunks, Tally()), freqs, "complex", r)
    sec = time.perf_counter() - t
    return {"path": "single", "records": fs.n, "seconds": sec, "records_per_s": fs.n / sec,
            "peak_rss_bytes": peak_rss_bytes()}


def on_dask(folder: Path, d: int, m: int, r: int, workers: int) -> dict:
    from dask.distributed import Client, LocalCluster

    box, freqs = operator(d, m)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        records = DaskRecords(folder, scheduler=cluster.scheduler_address)
        t = time.perf_counter()
        fs = records.feature_sum(freqs, "complex", r, box, Tally())
        sec = time.perf_counter() - t
        peaks = client.run(peak_rss_bytes)
    return {"path": "dask", "workers": workers, "records": fs.n, "seconds": sec,
            "records_per_s": fs.n / sec, "worker_peak_rss_bytes": sorted(peaks.values()),
            "device_peak_rss_bytes": peak_rss_bytes()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--part-rows", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--m", type=int, default=1000)
    parser.add_argument("--r", type=int, default=1)
    parser.add_argument("--single-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single_only:  # the child process of the single path
        print(json.dumps(single(args.folder, args.d, args.m, args.r)))
        return
    t = time.perf_counter()
    write_folder(args.folder, args.rows, args.part_rows, args.d)
    print(json.dumps({"wrote_or_kept": str(args.folder), "rows": args.rows,
                      "seconds": time.perf_counter() - t}), flush=True)
    for path in ("single", "dask"):
        load = os.getloadavg()
        if path == "single":
            child = subprocess.run([sys.executable, __file__, "--folder", str(args.folder), "--d",
                                    str(args.d), "--m", str(args.m), "--r", str(args.r),
                                    "--single-only"], capture_output=True, text=True, check=True)
            out = json.loads(child.stdout)
        else:
            out = on_dask(args.folder, args.d, args.m, args.r, args.workers)
        print(json.dumps({**out, "load_before": load, "load_after": os.getloadavg(),
                          "cpus": os.cpu_count()}), flush=True)


if __name__ == "__main__":
    main()
