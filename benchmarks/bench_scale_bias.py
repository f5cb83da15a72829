"""Issue 31 item 5: would a coarser σ than the calibration's pick, or a low-pass decode, fix CKM on
the count table (baseball) without hurting the tables it works on? (benchmarks/RESULTS.md §14.)

The central ``ckm`` pipeline of ``server/bench/ckm.py`` (replace-one, σ's calibration round at
0.1 of ε over the range [w/300, w/3] for a box of width w, the sketch at the rest, m planned by
``plan_sketch_size``, CL-OMPR with 3 replicates in the public box), with the σ or the decoding
changed as a variant says; each variant's sketch is a release of its own (fresh OS noise):

* ``now``: σ as the calibration picks it (``choose_scale``);
* ``xC``: σ = C·(that σ), a coarser bias;
* ``lowQ``: that σ, decoded on the fraction Q of the m entries of smallest ‖ω‖ only
  (post-processing of the public Ω; the kept entries re-normalized by √(m/m_kept));
* ``ruleR/T``: a candidate rule from the calibration's two statistics alone: where the fit is
  reliable and the block medians' σ̃ is at least R times the envelope fit σ̂ (an envelope that is
  not Gaussian), σ = T·σ̃; else σ as now.

Sets: ``realdata.py``'s (standardized, box ±6 sd) and ``mixture``, paper 004's (200,000 records,
k = d = 10, separation 2.5, box ±15). Relative SSE against scikit-learn KMeans (n_init = 3).

Usage: python benchmarks/bench_scale_bias.py [--sets baseball,diamonds,flights,mhtdata,mixture,digits]
           [--variants now,x2,low0.5,rule1.2/2] [--eps inf,1,0.5] [--seeds 3] [--rows N] [--cache DIR]
Prints one markdown row per (set, ε): median [min, max] over the seeds per variant, and the
calibration's σ̂, σ̃ and choice of the first seed.
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path

import numpy as np
import realdata

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.features import FIRST_HARMONIC
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.scale import ScaleCalibration, calibrate_scale
from fedsketch.common.sketch.spec import SketchSpec, release_sketch
from fedsketch.common.study.sizing import DEFAULT_MAX_WORK, plan_sketch_size
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.clompr import clompr

HERE = Path(__file__).resolve().parent


def load(name: str, rows: int | None, cache: Path) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(records (n, d), k, box lo, box hi) of a set (module docstring)."""
    if name == "mixture":
        x, k = gmm(200_000, 10, 10, 2.5, 0)[0].astype(np.float64), 10
        lo, hi = np.full(10, -15.0), np.full(10, 15.0)
    else:
        data = realdata.load(name, cache)
        (x, k), (lo, hi) = (data.x, data.k), data.box
    if rows is not None and rows < x.shape[0]:
        x = x[np.random.default_rng(0).choice(x.shape[0], rows, replace=False)]
    return x, k, lo, hi


def scale_and_kept(variant: str, cal: ScaleCalibration) -> tuple[float, float]:
    """(σ, fraction of the entries decoded) of ``variant`` (module docstring) from calibration."""
    if variant == "now":
        return cal.sigma, 1.0
    if variant.startswith("x"):
        return float(variant[1:]) * cal.sigma, 1.0
    if variant.startswith("low"):
        return cal.sigma, float(variant[3:])
    if variant.startswith("rule"):
        ratio, times = (float(v) for v in variant[4:].split("/"))
        active = cal.reliable and cal.spread >= ratio * cal.fitted
        return (times * cal.spread if active else cal.sigma), 1.0
    raise ValueError(f"unknown variant {variant!r}")


def one_run(x: np.ndarray, k: int, box: Box, eps: float, variant: str, cal: ScaleCalibration,
            rng: np.random.Generator) -> float:
    """Relative SSE (to scikit-learn's SSE, divided by the caller) of one sketch and decoding."""
    n, d = x.shape
    eps_main = 0.9 * eps if math.isfinite(eps) else math.inf
    m = plan_sketch_size(n, d, k, eps_main, neighbouring="replace_one", feature="complex",
                         max_work=DEFAULT_MAX_WORK).m
    sigma, kept = scale_and_kept(variant, cal)
    spec = SketchSpec(FrequencySpec(d=d, m=m, scale=sigma, seed=int(rng.integers(2**31))), "complex", 1,
                      PrivacySpec(eps_main, 0.0, "replace_one"))
    release = release_sketch(spec, split(x), box)
    freqs = draw_frequencies(spec.frequencies)
    keep = np.argsort(np.linalg.norm(freqs.omega, axis=0))[: max(k, round(kept * m))]
    out = clompr(release.sketch[keep] * math.sqrt(m / keep.size), freqs.omega[:, keep], freqs.xi[keep], k,
                 box.lo, box.hi, harmonic=FIRST_HARMONIC["complex"], replicates=3, rng=rng)
    return sse_per_n(split(x), out.centroids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="baseball,diamonds,flights,mhtdata,mixture,digits")
    p.add_argument("--variants", default="now,x2,low0.5,rule1.2/2")
    p.add_argument("--eps", default="inf,1,0.5")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--cache", type=Path, default=HERE / "out" / "realdata")
    args = p.parse_args()
    variants = args.variants.split(",")
    print("| set | ε | " + " | ".join(variants) + " | σ̂, σ̃, choice (seed 0) |\n|---|---|"
          + "---|" * (len(variants) + 1))
    for name in args.sets.split(","):
        x, k, lo, hi = load(name, args.rows, args.cache)
        box, width = Box(lo, hi), float(np.max(hi - lo))
        ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, k, 0, n_init=3))
        for eps in (float(e) for e in args.eps.split(",")):
            scores: dict[str, list[float]] = {v: [] for v in variants}
            cals = []
            for seed in range(args.seeds):
                rng = np.random.default_rng(seed)
                cal = calibrate_scale(partial(split, x), box, 0.1 * eps, neighbouring="replace_one",
                                      scale_range=(width / 300, width / 3))
                cals.append(cal)
                for v in variants:
                    scores[v].append(one_run(x, k, box, eps, v, cal, rng) / ref)
            cells = [f"{np.median(s):.3f} [{min(s):.3f}, {max(s):.3f}]" for s in scores.values()]
            c0 = cals[0]
            print(f"| {name} | {eps:g} | " + " | ".join(cells)
                  + f" | {c0.fitted:.2f}, {c0.spread:.2f}, {c0.choice} |", flush=True)


if __name__ == "__main__":
    main()
