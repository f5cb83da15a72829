"""What the integer grid costs: the ``complex`` map's features rounded to γ = 1024 steps per unit
(MECHANISMS §1.10) against the float features they replace.

For each dataset the float sketch s = Σ e^{i(Ωᵀx+ξ)}/(n√m) (float64 phases, the peer) and the
released grid sketch S/(γ·n·√m) (the product, noiseless) are compared three ways:

* rounding error: the rms over the 2m real coordinates of s_grid − s_float, against the rms of
  the ε-noise on the same coordinates (replace-one, r = m) at ε = 0.1, 1 and 10;
* noise: the grid's sensitivity κ = 1450 against the float mechanism's 2√2·γ = 1448.2 (the noise
  grows by the same ratio, whatever ε and n);
* utility: CL-OMPR on each noiseless sketch with the same decoder seed, relative SSE against
  scikit-learn KMeans (k-means++, n_init = 3) on the same data.

Datasets: paper 004's mixture (k = d = 10, separation 2.5, n = ``--n``, σ = 2, box [−15, 15]),
and scikit-learn's handwritten digits (1,797 × 64, shipped inside the scikit-learn wheel; k = 10,
pixel box [0, 16] public, σ = 8). m = 1,000 for both; ``--replicates`` (3) CL-OMPR replicates.
Prints medians over ``--seeds`` seeds.

Usage: python benchmarks/bench_grid.py [--seeds 5] [--n 1000000] [--replicates 3]
"""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np
from sklearn.datasets import load_digits

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.calibration import dlap_variance, l1_sensitivity
from fedsketch.common.dp.plan import noise_plan
from fedsketch.common.features import ENTRY_L1, GRID
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.pipeline import decode_centroids

EPSILONS = (0.1, 1.0, 10.0)


def float_sketch(x: np.ndarray, omega: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """Σ e^{i(Ωᵀx+ξ)}/(n√m) in float64, in blocks (the float features the grid replaces)."""
    total = np.zeros(omega.shape[1], dtype=np.complex128)
    for start in range(0, x.shape[0], 16384):
        t = x[start:start + 16384].astype(np.float64) @ omega + xi
        total += np.exp(1j * t).sum(axis=0)
    return total / (x.shape[0] * math.sqrt(omega.shape[1]))


def compare(x: np.ndarray, k: int, m: int, sigma: float, lo: float, hi: float, seed: int,
            replicates: int = 3) -> dict:
    """Rounding error against noise, and the relative SSE of both noiseless sketches."""
    n, d = x.shape
    spec = SketchSpec(FrequencySpec(d=d, m=m, scale=sigma, seed=seed), "complex", m,
                      PrivacySpec(math.inf))
    freqs = draw_frequencies(spec.frequencies)
    grid = feature_sum(split(x), freqs, "complex").clean_sketch()
    exact = float_sketch(x, freqs.omega, freqs.xi)
    diff = np.concatenate([(grid - exact).real, (grid - exact).imag])
    out = {"rounding_rms": float(np.sqrt(np.mean(diff**2)))}
    for eps in EPSILONS:
        (term,) = noise_plan("complex", m, m, PrivacySpec(eps))
        out[f"noise_rms eps={eps:g}"] = math.sqrt(dlap_variance(term.scale)) / (GRID["complex"] * n
                                                                                * math.sqrt(m))
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, k, seed))
    box = (np.full(d, lo), np.full(d, hi))
    for name, sketch in (("grid", grid), ("float", exact)):
        dec = decode_centroids(sketch, spec, k, *box, replicates=replicates,
                                 rng=np.random.default_rng(seed))
        out[f"rel_sse {name}"] = sse_per_n(split(x), dec.centroids) / ref
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--replicates", type=int, default=3, help="CL-OMPR replicates per decoding")
    args = ap.parse_args()
    kappa, float_kappa = ENTRY_L1["complex"], math.sqrt(2) * GRID["complex"]
    print(f"noise: κ = {kappa} against √2·γ = {float_kappa:.1f}: ×{kappa / float_kappa:.5f} "
          f"(Δ1 = {l1_sensitivity('complex', 1, 'replace_one')} grid steps per selected entry)")
    digits = load_digits().data.astype(np.float32)
    for name, make, k, m, sigma, lo, hi in (
            ("gmm k=d=10", lambda s: gmm(args.n, 10, 10, 2.5, s)[0], 10, 1000, 2.0, -15.0, 15.0),
            ("digits 1797x64", lambda s: digits, 10, 1000, 8.0, 0.0, 16.0)):
        rows = [compare(np.asarray(make(s), dtype=np.float32), k, m, sigma, lo, hi, s, args.replicates)
                for s in range(args.seeds)]
        print(f"\n{name} (median of {args.seeds} seeds)")
        for key in rows[0]:
            print(f"  {key:24s} {statistics.median(r[key] for r in rows):.4g}")
        grid = statistics.median(r["rel_sse grid"] for r in rows)
        flt = statistics.median(r["rel_sse float"] for r in rows)
        print(f"  ratio grid/float        {grid / flt:.5f}")
        worst = max(r["rounding_rms"] / r["noise_rms eps=10"] for r in rows)
        print(f"  rounding/noise at ε=10  {worst:.3g} (largest over seeds)")


if __name__ == "__main__":
    main()
