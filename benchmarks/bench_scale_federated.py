"""Federated ``--scale auto`` (a study's round 0) against fixed σ, through ``fedsketch simulate``'s
machinery (a real coordinator and real devices over loopback gRPC with TLS).

Sets: paper 004's mixture (``simulate``'s default: 10^6 records, d = 10, k = 10, box ±15,
good σ = 2; RESULTS §1) and ``benchmarks/realdata.py``'s diamonds (53,940 rows) and flights
(327,346 rows), d = 7, k = 5, standardized, box ±6, σ = 1 the fixed scale of §8. L = 20 devices
(``--devices``), iid, replace-one, m = 1000, ε per device in all (round 0 takes a tenth under
auto), the sketch alone (T = 0: σ shapes only the sketch); ``local`` noise (a draw per device)
or ``secure`` aggregation (one draw in all, no dropouts assumed). Relative SSE = SSE(C)/SSE(
scikit-learn KMeans, n_init = 10 on the real sets) on the pooled records.

Usage: python benchmarks/bench_scale_federated.py [--seeds 3] [--eps 1] [--sets mixture,diamonds]
           [--modes local,secure] [--devices 20] [--records 1000000] [--rows N] [--cache DIR]
(--records: the mixture's size; --rows: a random subset of N rows of each real set, for a quick
run.)
Prints a markdown table: per set, mode, ε and scale, the median relative SSE [min, max] over the
seeds and, for auto, the σ chosen in each run and how.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from itertools import product
from pathlib import Path

import numpy as np
import realdata

from fedsketch.common.dp.lloyd import nearest
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.sim.simulate import Pooled, SimConfig, pooled_data, run_simulation

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eps", default="1")
    parser.add_argument("--sets", default="mixture,diamonds")
    parser.add_argument("--modes", default="local")
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--cache", type=Path, default=HERE / "out" / "realdata")
    args = parser.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]
    print("| set | noise | ε | scale | relative SSE, median | [min, max] | σ chosen (how) |\n"
          "|---|---|---|---|---|---|---|")
    for name in args.sets.split(","):
        if name == "mixture":
            base, fixed = SimConfig(devices=args.devices, records=args.records, rounds=0), 2.0
            data = {seed: pooled_data(replace(base, seed=seed)) for seed in range(args.seeds)}
        else:
            real = realdata.load(name, args.cache)
            x = real.x
            if args.rows is not None and args.rows < x.shape[0]:
                x = x[np.random.default_rng(0).choice(x.shape[0], args.rows, replace=False)]
            ref = sklearn_kmeans_centroids(x, real.k, 0, n_init=10)
            pooled = Pooled(x, nearest(x, ref)[0], sse_per_n(split(x), ref))
            lo, hi = real.box
            base, fixed = SimConfig(devices=args.devices, records=x.shape[0], k=real.k, d=x.shape[1],
                                    box=(tuple(lo), tuple(hi)), rounds=0), 1.0
            data = dict.fromkeys(range(args.seeds), pooled)
        for mode, eps, scale in product(args.modes.split(","), epsilons, (fixed, None)):
            scores, chosen = [], []
            for seed in range(args.seeds):
                cfg = replace(base, epsilon=eps, scale=scale, seed=seed,
                              secure_aggregation=mode == "secure", stage_timeout=30.0)
                report = run_simulation(cfg, data[seed])
                scores.append(report["relative_sse"])
                if (cal := report["calibration"]) is not None:
                    chosen.append(f"{cal['sigma']:.2f} ({cal['choice']})")
            v = np.array(scores)
            print(f"| {name} | {mode} | {eps:g} | {'auto' if scale is None else f'{scale:g}'} | "
                  f"{np.median(v):.3f} | [{v.min():.3f}, {v.max():.3f}] | {', '.join(chosen)} |",
                  flush=True)

if __name__ == "__main__":
    main()
