"""Reproductions behind ``fedsketch compare`` (plots in benchmarks/plots/, tables for RESULTS.md).

pca       paper 003 Fig. 2: n = 5000, d = 10, k = 2, the listed eigenvalues, α = ε from 0.1
          to 2; q_F of PCA, MOD-SULQ (δ = 0.05), PPCA and a random subspace. Rows are bounded
          by R = 3 (no row is clipped; q_F is then in units of R²).
subspace  paper 001 Fig. 2 (middle column): n = 1000, d = 10, k = 3, q = 3, σ = 0.1; k-means
          subspace cost and d_W of k-plane, the Gibbs sampler, sample-and-aggregate and SuLQ;
          then SuLQ at d = 5 against d = 20.
kmeans    paper 004 Fig. 1 at n = 10^6 (k = d = 10, separation 2.5): relative SSE of CKM,
          CKM quantized, DPLloyd, DPLloyd + Su, DPLloyd + Su over-seeded, white and colored
          Gaussian centroids.
su-floor  the noiseless floor of DPLloyd's data-independent starts on the same data (n = 2·10^5,
          box ±15): Lloyd with exact means from Su's sphere packing (2 iterations, and run to
          convergence) and from a uniform start, against the over-seeded start (with the
          variant's relocation of empty centres) reduced to k.
          No privacy is involved: this bounds what any amount of ε can give each start.
su-robust how often each Su-based method misses 1.2 at ε = 0.1 and 0.03 (n = 10^6, box ±15),
          one dataset per trial: DPLloyd + Su, the over-seeded variant without relocation (3k
          centres, this variant's first version) and ``dplloyd-su-overseed`` as it is now.

Usage: python benchmarks/bench_compare.py pca|subspace|kmeans|su-floor|su-robust [--trials T]
          [--n N] (--n: su-floor and su-robust only)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.lloyd import cluster_stats, nearest
from fedsketch.server.bench import kmeans as kp
from fedsketch.server.bench.compare import compare, plot, synthetic
from fedsketch.server.bench.task import Task

PLOTS = Path(__file__).resolve().parent / "plots"


def table(rows, title: str) -> None:
    print(f"\n{title}\n\n| method | ε | metric | median | q1 | q3 | seconds | guarantee |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.method} | {r.epsilon:g} | {r.metric} | {r.median:.4g} | {r.q1:.4g} | "
              f"{r.q3:.4g} | {r.seconds:.2f} | {r.guarantee} |")


def run(family: str, n: int, d: int, k: int, eps: list[float], names: list[str], trials: int,
        png: str, title: str, q: int = 1, noise: float = 0.1, norm_bound: float = 1.0,
        delta: float = 1e-6, box: float | None = None) -> list:
    data = synthetic(family, n, d, k, q, noise, seed=0)
    lo = hi = None
    if box is not None:
        lo, hi = np.full(d, -box), np.full(d, box)
    base = Task(data.x, k, eps[0], delta, lo, hi, norm_bound, q, "replace_one", False,
                np.random.default_rng(0))
    t = time.perf_counter()
    rows = compare(family, data, base, eps, names, trials)
    print(f"{title}: {time.perf_counter() - t:.0f} s", flush=True)
    PLOTS.mkdir(exist_ok=True)
    plot(rows, str(PLOTS / png), title)
    table(rows, title)
    return rows


def exact_lloyd(x: np.ndarray, c: np.ndarray, iterations: int,
                between: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """``iterations`` Lloyd steps with exact means (an empty cluster keeps its centre), with
    ``between(c, counts)`` applied after every step but the last; returns the centres and the
    last counts."""
    for t in range(iterations):
        labels, _ = nearest(x, c)
        counts, sums = cluster_stats(x, labels, c.shape[0])
        c = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1.0)[:, None], c)
        if between is not None and t < iterations - 1:
            c = between(c, counts)
    return c, counts


def su_floor(seeds: int, n: int = 200_000, k: int = 10, half: float = 15.0) -> None:
    """Relative SSE of noiseless Lloyd from each data-independent start, ``seeds`` datasets."""
    rel: dict[str, list[float]] = {}
    box = np.full(k, half)
    for seed in range(seeds):
        x = gmm(n, k, k, 2.5, seed)[0].astype(np.float64)
        rng = np.random.default_rng(1000 + seed)
        ref = nearest(x, kp.converged_kmeans(x, k, rng)[0])[1].sum()
        packing = kp.sphere_packing_init(k, k, rng)[0] * half
        over, counts = exact_lloyd(x, kp.sphere_packing_init(kp.OVERSEED * k, k, rng)[0] * half, 2,
                                   lambda c, n, g=rng: kp.relocate_unreliable(c, n, 0.0, k, box, g)[0])
        reduced, _ = kp.reduce_centroids(over, counts, 0.0, k, rng, np.zeros(k))
        starts = {
            "Su sphere packing, T = 2": exact_lloyd(x, packing, 2)[0],
            "Su sphere packing, converged": kp.lloyd(x, packing)[0],
            "uniform in the box, converged": kp.lloyd(x, rng.uniform(-half, half, (k, k)))[0],
            f"over-seeded ({kp.OVERSEED}k), relocation, T = 2, reduced": reduced,
        }
        for name, c in starts.items():
            rel.setdefault(name, []).append(float(nearest(x, c)[1].sum() / ref))
        print(f"seed {seed}: " + ", ".join(f"{v[-1]:.3f}" for v in rel.values()), flush=True)
    print(f"\nnoiseless floor, n = {n}, k = d = {k}, box ±{half:g}, {seeds} datasets\n\n"
          "| start | median | q1 | q3 | max |\n|---|---|---|---|---|")
    for name, v in rel.items():
        q1, med, q3 = np.quantile(v, [0.25, 0.5, 0.75])
        print(f"| {name} | {med:.3f} | {q1:.3f} | {q3:.3f} | {max(v):.3f} |")


def overseed_without_relocation(task: Task) -> np.ndarray:
    """The over-seeded variant's first version: 3k centres, no relocation (data units)."""
    centres, run, _ = kp.overseeded(task, 3, relocate=False)
    return centres + run.data.centre


def su_robust(datasets: int, n: int = 1_000_000, k: int = 10, half: float = 15.0,
              epsilons: tuple[float, ...] = (0.1, 0.03)) -> None:
    """Relative SSE of each Su-based method on ``datasets`` datasets of paper 004's protocol (one
    run per dataset and ε, replace-one); prints per-dataset rows, then median, q3, max and the
    share of runs above 1.2."""
    methods = {
        "DPLloyd + Su": lambda t: kp.dplloyd_su(t).output,
        "over-seeded 3k, no relocation": overseed_without_relocation,
        f"dplloyd-su-overseed ({kp.OVERSEED}k, relocation)": lambda t: kp.dplloyd_su_overseed(t).output,
    }
    rel: dict[tuple[str, float], list[float]] = {}
    h = np.full(k, half)
    for seed in range(datasets):
        x = gmm(n, k, k, 2.5, seed)[0].astype(np.float64)
        ref = nearest(x, kp.converged_kmeans(x, k, np.random.default_rng(100 + seed))[0])[1].sum()
        for eps in epsilons:
            for name, method in methods.items():
                task = Task(x, k, eps, lo=-h, hi=h, rng=np.random.default_rng(7000 + seed))
                rel.setdefault((name, eps), []).append(float(nearest(x, method(task))[1].sum() / ref))
        print(f"dataset {seed}: " + ", ".join(f"{v[-1]:.3f}" for v in rel.values()), flush=True)
    print(f"\nSu-based methods, n = {n}, k = d = {k}, box ±{half:g}, {datasets} datasets\n\n"
          "| method | ε | median | q3 | max | runs > 1.2 |\n|---|---|---|---|---|---|")
    for (name, eps), v in rel.items():
        q3 = np.quantile(v, 0.75)
        print(f"| {name} | {eps:g} | {np.median(v):.3f} | {q3:.3f} | {max(v):.3f} | "
              f"{sum(r > 1.2 for r in v)} of {len(v)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("part", choices=("pca", "subspace", "kmeans", "su-floor", "su-robust"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--n", type=int, default=None, help="records (su-floor, su-robust)")
    args = ap.parse_args()
    if args.part == "pca":
        run("pca", 5000, 10, 2, [0.1, 0.2, 0.5, 1.0, 2.0], ["pca", "mod-sulq", "ppca", "random"],
            args.trials, "pca_fig2.png", "paper 003 Fig. 2: n = 5000, d = 10, k = 2",
            norm_bound=3.0, delta=0.05)
    elif args.part == "subspace":
        run("subspace", 1000, 10, 3, [0.1, 1.0, 10.0, 100.0],
            ["kplane", "gibbs", "sample-aggregate", "sulq-kplane"], args.trials,
            "subspace_fig2.png", "paper 001 Fig. 2: n = 1000, d = 10, k = 3, q = 3, σ = 0.1",
            q=3, delta=1e-3)
        for d in (5, 20):
            run("subspace", 1000, d, 3, [1.0, 10.0, 100.0], ["kplane", "sulq-kplane"],
                args.trials, f"subspace_sulq_d{d}.png", f"SuLQ k-plane, d = {d}", q=3,
                delta=1e-3)
    elif args.part == "su-floor":
        su_floor(args.trials, **({"n": args.n} if args.n else {}))
    elif args.part == "su-robust":
        su_robust(args.trials, **({"n": args.n} if args.n else {}))
    else:
        run("kmeans", 1_000_000, 10, 10, [0.001, 0.003, 0.01, 0.03, 0.1, 1.0],
            ["ckm", "ckm-quantized", "dplloyd", "dplloyd-su", "dplloyd-su-overseed", "white", "colored"],
            args.trials,
            "kmeans_fig1.png", "paper 004 Fig. 1: n = 10^6, k = d = 10", box=15.0, delta=1e-6)


if __name__ == "__main__":
    main()
