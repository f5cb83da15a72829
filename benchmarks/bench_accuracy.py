"""Accuracy of compressive k-means against scikit-learn KMeans (k-means++, n_init = 3).

Paper 004's protocol: k = d = 10, separation 2.5. For each seed, one dataset, one KMeans reference
on it, and every configuration decoded from the sketch of that same dataset:

    nonprivate  n = 10^6, ε = ∞: complex m = 10kd and m = 100kd, quantized m = 10kd (r = m)
    private     n = 10^7, m = 10kd, r = 1, replace-one: ε = 0.01 and 0.005 (complex)

σ = 2 and 3 CL-OMPR replicates (the lowest sketch residual wins). Prints per-seed relative SSE,
then medians, and a markdown table for benchmarks/RESULTS.md.
Usage: python benchmarks/bench_accuracy.py [nonprivate|private] [--seeds S] [--n N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec, release_sketch
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.pipeline import decode_centroids

K = D = 10
BOUND = 15.0
#: σ (data units): the pick of the oracle grid in bench_scale.py (public knowledge here, as in
#: pycle's DP demo; ``--scale auto`` is measured there).
SIGMA = 2.0

#: (label, feature, m, r or None for m, ε)
SUITES = {
    "nonprivate": [
        ("complex m=10kd", "complex", 10 * K * D, None, float("inf")),
        ("complex m=100kd", "complex", 100 * K * D, None, float("inf")),
        ("quantized m=10kd", "quantized", 10 * K * D, None, float("inf")),
    ],
    "private": [
        ("complex m=10kd r=1 eps=0.01", "complex", 10 * K * D, 1, 0.01),
        ("complex m=10kd r=1 eps=0.005", "complex", 10 * K * D, 1, 0.005),
    ],
}
DEFAULT_N = {"nonprivate": 1_000_000, "private": 10_000_000}
DEFAULT_SEEDS = {"nonprivate": 10, "private": 5}


def run_seed(seed: int, n: int, configs, replicates: int) -> dict[str, float]:
    """Relative SSE of every configuration on the dataset of ``seed``."""
    x, _, _ = gmm(n, K, D, 2.5, seed)
    t = time.perf_counter()
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, K, seed))
    print(f"  seed {seed}: data + k-means {time.perf_counter() - t:.0f} s", flush=True)
    lo, hi = np.full(D, -BOUND), np.full(D, BOUND)
    out = {}
    for label, feature, m, r, eps in configs:
        spec = SketchSpec(FrequencySpec(d=D, m=m, scale=SIGMA, seed=seed), feature,
                          m if r is None else r, PrivacySpec(eps))
        t = time.perf_counter()
        release = release_sketch(spec, split(x), Box(lo, hi))
        t_sk = time.perf_counter() - t
        t = time.perf_counter()
        res = decode_centroids(release.sketch, spec, K, lo, hi, replicates=replicates,
                               rng=np.random.default_rng(seed))
        t_dec = time.perf_counter() - t
        out[label] = sse_per_n(split(x), res.centroids) / ref
        print(f"    {label}: relative SSE {out[label]:.4f} (sketch {t_sk:.1f} s, "
              f"decode {t_dec:.1f} s)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--n", type=int)
    ap.add_argument("--replicates", type=int, default=3)
    args = ap.parse_args()
    n = args.n or DEFAULT_N[args.suite]
    seeds = args.seeds or DEFAULT_SEEDS[args.suite]
    configs = SUITES[args.suite]
    print(f"{args.suite}: n = {n:,}, {seeds} seeds, replicates = {args.replicates}")
    rows = [run_seed(s, n, configs, args.replicates) for s in range(seeds)]
    print(f"\n| configuration (n = {n:,}, {seeds} seeds) | median relative SSE | min | max |")
    print("|---|---|---|---|")
    for label, *_ in configs:
        vals = [r[label] for r in rows]
        print(f"| {label} | {statistics.median(vals):.4f} | {min(vals):.4f} | {max(vals):.4f} |")


if __name__ == "__main__":
    main()
