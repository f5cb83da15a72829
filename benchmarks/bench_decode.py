"""CL-OMPR decoding speed and quality, against pycle 1.2's ``CLOMP_CKM.fit_once`` in the same run.

Both decoders get the same noiseless sketch of a paper-004 GMM (k = d = 10, n = 10^5), the same
Ω and ξ (m = 1000, σ = 2), the same box [−15, 15]^10, one replicate each, and BLAS pinned to one
thread (pycle with two OpenBLAS threads is many times slower on 2 cores; DESIGN §8). Each run
uses another dataset seed; the table gives median wall seconds and median relative SSE against
scikit-learn KMeans (k-means++, n_init = 3) on the same data.

Usage: python benchmarks/bench_decode.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.clompr import clompr

K = D = 10
M, N, SIGMA, BOUND = 1000, 100_000, 2.0, 15.0


def one_run(seed: int) -> dict[str, float]:
    import pycle.compressive_learning as cl
    import pycle.sketching as pysk

    x, _, _ = gmm(N, K, D, 2.5, seed)
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, K, seed))
    freqs = draw_frequencies(FrequencySpec(d=D, m=M, scale=SIGMA, seed=seed))
    sketch = privatize(feature_sum(split(x), freqs, "complex"), PrivacySpec(float("inf"))).sketch
    lo, hi = np.full(D, -BOUND), np.full(D, BOUND)

    t = time.perf_counter()
    ours = clompr(sketch, freqs.omega, freqs.xi, K, lo, hi, rng=np.random.default_rng(seed))
    t_ours = time.perf_counter() - t

    phi = pysk.SimpleFeatureMap("ComplexExponential", np.array(freqs.omega), np.array(freqs.xi),
                                c_norm="unit")
    solver = cl.CLOMP_CKM(phi, K, np.stack([lo, hi]), sketch)
    np.random.seed(seed)
    t = time.perf_counter()
    with threadpool_limits(1):
        solver.fit_once()
    t_pycle = time.perf_counter() - t
    _, theirs = solver.current_sol
    return {
        "ours_s": t_ours,
        "pycle_s": t_pycle,
        "ours_rel": sse_per_n(split(x), ours.centroids) / ref,
        "pycle_rel": sse_per_n(split(x), np.asarray(theirs)) / ref,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for seed in range(args.runs):
        rows.append(one_run(seed))
        r = rows[-1]
        print(f"seed {seed}: fedsketch {r['ours_s']:.2f} s (relative SSE {r['ours_rel']:.4f}), "
              f"pycle {r['pycle_s']:.2f} s (relative SSE {r['pycle_rel']:.4f})", flush=True)
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    print(f"\n| CL-OMPR, k = d = {K}, m = {M}, 1 replicate ({args.runs} runs) | fedsketch | "
          f"pycle fit_once | ratio |")
    print("|---|---|---|---|")
    print(f"| median wall s | {med['ours_s']:.2f} | {med['pycle_s']:.2f} | "
          f"{med['pycle_s'] / med['ours_s']:.1f}x |")
    print(f"| median relative SSE | {med['ours_rel']:.4f} | {med['pycle_rel']:.4f} | |")


if __name__ == "__main__":
    main()
