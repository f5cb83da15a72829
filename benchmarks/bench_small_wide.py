"""A small, wide table in its own units: scikit-learn's digits (1,797 × 64, k = 10, the pixel box
[0, 16]^64, not standardized), where no sketch can carry the centroids at ε ≤ 2
(:mod:`fedsketch.common.study.sizing`).

Rows, each scored as relative SSE = SSE(C)/SSE(scikit-learn KMeans, n_init = 10) on the records:

* ``ckm-lloyd ε = ∞``: the non-private pipeline, wall and CPU seconds (the issue's ≤ 10 s);
* ``ckm-lloyd`` at each ε, under add/remove and replace-one (``fedsketch compare``'s method);
* ``diffprivlib`` 0.6.6's KMeans at ε (add/remove, its calibration) and at ε/2 (replace-one at ε
  is add/remove at ε/2), same box, in the venv of ``bench_realdata.py``;
* ``federated`` (``--devices L``, 0 to skip): a secure study over L devices through
  ``simulate``'s machinery (real coordinator and devices on loopback), replace-one, σ = 2 pixels
  fixed (an eighth of the box's width), T = 3 refinement rounds, m and the rounds' share as the
  study plans them (:func:`fedsketch.common.study.sizing.plan_study`: m = 640, the rounds 0.95
  of ε, the sketch being blind; m = 1000 and 0.8 before the plan).

Usage: python benchmarks/bench_small_wide.py [--eps 1] [--seeds 5] [--devices 0]
           [--stage-timeout 300] [--no-diffprivlib]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_realdata  # noqa: E402
import realdata  # noqa: E402

from fedsketch.common.dp.lloyd import nearest  # noqa: E402
from fedsketch.server.bench.compare import methods  # noqa: E402
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n  # noqa: E402
from fedsketch.server.bench.task import Task  # noqa: E402

PIXEL = 16.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eps", default="1")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--devices", type=int, default=0)
    p.add_argument("--stage-timeout", type=float, default=300.0)
    p.add_argument("--no-diffprivlib", action="store_true")
    args = p.parse_args()
    x = realdata.digits()
    d, k = x.shape[1], 10
    lo, hi = np.zeros(d), np.full(d, PIXEL)
    reference = sklearn_kmeans_centroids(x, k, 0, n_init=10)
    ref = sse_per_n(split(x), reference)

    def score(c: np.ndarray) -> float:
        return sse_per_n(split(x), c) / ref

    def show(label: str, values: list[float], seconds: list[float]) -> None:
        v = np.array(values)
        print(f"| {label} | {np.median(v):.3f} | [{v.min():.3f}, {v.max():.3f}] | "
              f"{np.median(seconds):.1f} | {len(v)} |", flush=True)

    print("| row | relative SSE, median | [min, max] | seconds (wall) | runs |\n|---|---|---|---|---|")
    ckm_lloyd = methods("kmeans")["ckm-lloyd"]
    wall, cpu = time.perf_counter(), time.process_time()
    out = ckm_lloyd(Task(x, k, math.inf, lo=lo, hi=hi, rng=np.random.default_rng(0)))
    show(f"ckm-lloyd ε = ∞ (CPU {time.process_time() - cpu:.1f} s)", [score(out.output)],
         [time.perf_counter() - wall])
    epsilons = [float(e) for e in args.eps.split(",")]
    for eps in epsilons:
        for relation in ("add_remove", "replace_one"):
            values, seconds = [], []
            for seed in range(args.seeds):
                t = time.perf_counter()
                out = ckm_lloyd(Task(x, k, eps, lo=lo, hi=hi, neighbouring=relation,
                                     rng=np.random.default_rng(seed)))
                values.append(score(out.output))
                seconds.append(time.perf_counter() - t)
            show(f"ckm-lloyd ε = {eps:g}, {relation}", values, seconds)
    # diffprivlib's script takes a box ±B about 0: shift the records by the box centre and back.
    realdata.BOX = PIXEL / 2
    runs = {} if args.no_diffprivlib else bench_realdata.diffprivlib_runs(
        x - PIXEL / 2, k, sorted({*epsilons, *(e / 2 for e in epsilons)}), args.seeds)
    for eps in sorted({e for e, _ in runs}):
        cells = [v for (e, _), v in runs.items() if e == eps]
        show(f"diffprivlib ε = {eps:g}, add/remove", [score(c + PIXEL / 2) for c, _ in cells],
             [s for _, s in cells])
    if args.devices > 0:
        from fedsketch.server.sim.config import SimConfig
        from fedsketch.server.sim.simulate import Pooled, run_simulation

        labels, _ = nearest(x, reference)
        for eps in epsilons:
            values, seconds = [], []
            for seed in range(args.seeds):
                cfg = SimConfig(devices=args.devices, records=x.shape[0], k=k, d=d, epsilon=eps,
                                scale=2.0, seed=seed, box=(tuple(lo), tuple(hi)), rounds=3,
                                secure_aggregation=True, max_dropout=0.1,
                                stage_timeout=args.stage_timeout)
                t = time.perf_counter()
                report = run_simulation(cfg, Pooled(x, labels, ref))
                values.append(score(np.asarray(report["centroids"])))
                seconds.append(time.perf_counter() - t)
            show(f"federated, {args.devices} devices, secure, ε = {eps:g}", values, seconds)


if __name__ == "__main__":
    main()
