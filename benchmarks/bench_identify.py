"""Does the noise check flag the decodings that are garbage, and only those?

CKM (m = 10kd, r = 1, add/remove, σ from the private calibration round at 10 % of ε) on paper
004's mixture (d = 5, k = 5, box ±15) at n = 2,000 and 200,000, and on the real sets of
``benchmarks/realdata.py`` (standardized, box ±6 sd), at ε ∈ {0.01, 0.1, 1}, several seeds. Each
decoding's relative SSE (scikit-learn KMeans, n_init = 3) is printed beside the verdict of
``fedsketch.server.decode.identify`` (which reads only the sketch, its public spec and released
count), the smallest centroid z and the threshold. The summary gives the worst relative SSE that
was "identified" and the best that was "not identifiable".

Usage: python benchmarks/bench_identify.py [--sets mix2000,mix200000,flights,diamonds,digits]
           [--eps 0.01,0.1,1] [--seeds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realdata  # noqa: E402

from fedsketch.common.data.synthetic import gmm  # noqa: E402
from fedsketch.server.bench.ckm import ckm_run  # noqa: E402
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n  # noqa: E402
from fedsketch.server.bench.task import Task  # noqa: E402
from fedsketch.server.decode.identify import IDENTIFIED  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def dataset(name: str) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(records, k, lo, hi) of a set: "mix<n>" for paper 004's mixture, else a real set."""
    if name.startswith("mix"):
        x = gmm(int(name[3:]), 5, 5, 2.5, 0)[0].astype(np.float64)
        return x, 5, np.full(5, -15.0), np.full(5, 15.0)
    data = realdata.load(name, OUT / "realdata")
    return (data.x, data.k, *data.box)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="mix2000,mix200000,flights,diamonds,digits")
    p.add_argument("--eps", default="0.01,0.1,1")
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    print("| set | ε | seed | relative SSE | verdict | smallest z | threshold |\n"
          "|---|---|---|---|---|---|---|")
    seen: dict[str, list[float]] = {IDENTIFIED: [], "not identifiable": []}
    for name in args.sets.split(","):
        x, k, lo, hi = dataset(name)
        ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, k, 0))
        for eps in (float(e) for e in args.eps.split(",")):
            for seed in range(args.seeds):
                task = Task(x, k, eps, lo=lo, hi=hi, neighbouring="add_remove",
                            rng=np.random.default_rng(seed))
                centroids, _, _, decoded, _ = ckm_run(task, "complex")
                verdict = decoded.identifiability
                rel = sse_per_n(split(x), centroids) / ref
                seen[verdict.status].append(rel)
                print(f"| {name} | {eps:g} | {seed} | {rel:.3f} | {verdict.status} | {min(verdict.z):.3g} | "
                      f"{verdict.threshold:.3g} |", flush=True)
    good, bad = seen[IDENTIFIED], seen["not identifiable"]
    print(f"\n  identified: {len(good)} decodings, worst relative SSE {max(good, default=float('nan')):.3f}")
    print(f"  not identifiable: {len(bad)} decodings, best relative SSE {min(bad, default=float('nan')):.3f}")


if __name__ == "__main__":
    main()
