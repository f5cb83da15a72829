"""End to end on one 10^7 × 10 float32 ``.npy`` file: ``fedsketch sketch`` (m = 10kd, r = 1,
ε = ∞, σ = 2) then ``fedsketch decode`` (one replicate), as processes, against scikit-learn KMeans (k-means++,
n_init = 3) fitted on the same file in its own process. Wall times are medians of ``--runs``
runs; the relative SSE of the decoded centroids is against that KMeans.

Usage: python benchmarks/bench_pipeline.py [--runs 3] [--n 10000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_sketch import OUT, data_file

from fedsketch.common.data.dataio import load_all
from fedsketch.server.bench.metrics import split, sse_per_n

KMEANS = """
import json, sys, numpy as np
from sklearn.cluster import KMeans
x = np.load(sys.argv[1])
c = KMeans(n_clusters=10, init="k-means++", n_init=3, random_state=0).fit(x).cluster_centers_
print(json.dumps(c.tolist()))
"""


def timed(cmd: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=10_000_000)
    args = ap.parse_args()
    path = data_file(args.n, 10, 10)
    exe = str(Path(sys.executable).with_name("fedsketch"))
    sk = OUT / "pipeline.npz"
    ours, theirs, rel = [], [], []
    x = load_all(path)
    for run in range(args.runs):
        t1, _ = timed([exe, "sketch", str(path), "--m", "1000", "--r", "1", "--epsilon", "inf",
                       "--scale", "2",
                       "--seed", str(run), "--out", str(sk), "--quiet"])
        t2, out = timed([exe, "decode", str(sk), "--k", "10", "--bounds", "-15:15", "--replicates", "1",
                         "--seed", str(run), "--json", "--quiet"])
        t3, km = timed([sys.executable, "-c", KMEANS, str(path)])
        ours.append(t1 + t2)
        theirs.append(t3)
        sse = sse_per_n(split(x), json.loads(out)["centroids"])
        rel.append(sse / sse_per_n(split(x), json.loads(km)))
        print(f"run {run}: sketch {t1:.1f} s + decode {t2:.1f} s = {t1 + t2:.1f} s; "
              f"KMeans {t3:.1f} s; relative SSE {rel[-1]:.4f}", flush=True)
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"\n| {args.n:,} x 10 file | fedsketch sketch + decode | KMeans n_init=3 | ratio |")
    print("|---|---|---|---|")
    print(f"| wall s (median of {args.runs}) | {o:.1f} | {t:.1f} | {t / o:.1f}x |")
    print(f"| relative SSE (median) | {statistics.median(rel):.4f} | 1 | |")


if __name__ == "__main__":
    main()
