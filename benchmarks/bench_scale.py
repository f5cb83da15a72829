"""``--scale auto`` against the oracle grid search of σ, at the private setting of the issue.

Paper 004's GMM (k = d = 10, separation 2.5, n = ``--n``, 10^7), m = 10kd, r = 1, replace-one,
ε = 0.01. For each of ``--seeds`` (3) seeds:
  * oracle: a private sketch and a CL-OMPR decoding (``--replicates``, 3) for every σ of a grid, scored
    by relative SSE against scikit-learn KMeans (n_init = 3) — it reads the data, which a private
    pipeline may not; its best σ is the oracle's pick;
  * auto: the calibration round spends 10 % of ε (m0 = 64, range 0.1:10), then the main sketch
    spends the rest with the fitted σ.
Prints σ_auto / σ_oracle and both relative SSEs.
Usage: python benchmarks/bench_scale.py [--seeds 3] [--n 10000000] [--replicates 3]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.scale import calibrate_scale
from fedsketch.common.sketch.spec import SketchSpec, release_sketch
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.pipeline import decode_centroids

K = D = 10
M, EPS, FRACTION, BOUND = 10 * K * D, 0.01, 0.1, 15.0
GRID = (0.7, 1.0, 1.4, 2.0, 2.8, 4.0, 5.6)


def relative_sse(x: np.ndarray, ref: float, sigma: float, eps: float, seed: int,
                 replicates: int) -> float:
    spec = SketchSpec(FrequencySpec(d=D, m=M, scale=sigma, seed=seed), "complex", 1, PrivacySpec(eps))
    release = release_sketch(spec, split(x), Box(np.full(D, -BOUND), np.full(D, BOUND)))
    out = decode_centroids(release.sketch, spec, K, np.full(D, -BOUND), np.full(D, BOUND),
                           replicates=replicates, rng=np.random.default_rng(seed))
    return sse_per_n(split(x), out.centroids) / ref


def one_seed(seed: int, n: int, replicates: int) -> tuple[float, float, float, float]:
    """Oracle σ, auto σ, and the relative SSE of each on the dataset of ``seed``."""
    x, _, _ = gmm(n, K, D, 2.5, seed)
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, K, seed))
    grid = {s: relative_sse(x, ref, s, EPS, seed, replicates) for s in GRID}
    oracle = min(grid, key=grid.get)
    cal = calibrate_scale(lambda: split(x), Box(np.full(D, -BOUND), np.full(D, BOUND)),
                          EPS * FRACTION, seed=seed)
    auto = relative_sse(x, ref, cal.sigma, EPS * (1 - FRACTION), seed, replicates)
    print(f"seed {seed}: grid " + ", ".join(f"σ={s:g}: {v:.3f}" for s, v in grid.items()),
          flush=True)
    print(f"  oracle σ = {oracle:g} ({grid[oracle]:.4f}); auto σ = {cal.sigma:.3f} "
          f"(noise rms {cal.noise_rms:.3f}), relative SSE {auto:.4f}; "
          f"ratio {cal.sigma / oracle:.2f}", flush=True)
    return oracle, cal.sigma, grid[oracle], auto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3, help="datasets, seeds 0 to S - 1 (default: %(default)s)")
    ap.add_argument("--n", type=int, default=10_000_000, help="records per dataset (default: %(default)s)")
    ap.add_argument("--replicates", type=int, default=3,
                    help="CL-OMPR replicates per decoding (default: %(default)s)")
    args = ap.parse_args()
    rows = [one_seed(seed, args.n, args.replicates) for seed in range(args.seeds)]
    print(f"\n| seed (n = {args.n:,}) | oracle σ | auto σ | auto / oracle | rel. SSE oracle | rel. SSE auto "
          f"(ε = {EPS:g}, {FRACTION:.0%} spent on σ) |")
    print("|---|---|---|---|---|---|")
    for seed, (o, a, ro, ra) in enumerate(rows):
        print(f"| {seed} | {o:g} | {a:.3f} | {a / o:.2f} | {ro:.4f} | {ra:.4f} |")
    print(f"| median | | | {statistics.median(a / o for o, a, _, _ in rows):.2f} | "
          f"{statistics.median(r[2] for r in rows):.4f} | "
          f"{statistics.median(r[3] for r in rows):.4f} |")


if __name__ == "__main__":
    main()
