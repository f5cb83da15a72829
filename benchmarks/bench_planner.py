"""The utility planner's prediction against federated runs (``fedsketch simulate``'s harness).

Each configuration (L devices × n records each, ε per device, local noise or secure aggregation)
is planned from its public spec alone (:func:`fedsketch.common.study.planner.plan_study`: the expected
z of a centroid's atom against the decoder's threshold, ‖e‖/‖s‖ and the verdict), then run
through :func:`fedsketch.server.sim.simulate.run_simulation`: a real coordinator and L in-process
devices over TLS on loopback, paper 004's mixture (k = d = 10, separation 2.5, box ±15), m = 1000,
``complex``, r = 1, replace-one, σ = 2, the sketch alone (no refinement rounds; the planner
judges the sketch), ``--replicates`` CL-OMPR replicates; secure aggregation assumes 10 % dropouts
and no colluders (h_min = ⌊0.9·L⌋). Measured: relative SSE against KMeans (n_init = 3) on the
pooled records, the decoder's verdict, and the median and smallest z of the decoded centroids;
``--seeds`` seeds per configuration (the data, Ω and the decoder's starts).

Usage: python benchmarks/bench_planner.py [--replicates 3] [--seeds 2] [--only N] [--plot PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from fedsketch.common.study.planner import SAFETY, plan_study
from fedsketch.server.decode.identify import decoder_threshold
from fedsketch.server.sim.simulate import SimConfig, _study_spec, pooled_data, run_simulation

PLOTS = Path(__file__).resolve().parent / "plots"
#: (devices L, records per device, ε per device, secure aggregation), by predicted z/threshold:
#: below 1, between 1 and 3, above 3 (seed 0).
CONFIGS = (
    (10, 1_000, 1.0, False), (10, 10_000, 0.3, False), (20, 10_000, 0.1, False), (50, 1_000, 2.0, False),
    (100, 1_000, 1.0, False), (20, 1_000, 0.1, True), (20, 1_000, 0.3, True), (50, 1_000, 0.2, True),
    (10, 10_000, 0.5, False), (10, 10_000, 1.0, False), (10, 100_000, 0.1, False), (20, 10_000, 0.5, False),
    (50, 20_000, 0.2, False), (20, 10_000, 0.1, True), (50, 2_000, 0.5, True),
    (10, 30_000, 1.0, False), (20, 50_000, 0.5, False), (100, 10_000, 0.5, False), (20, 10_000, 0.3, True),
    (50, 10_000, 0.2, True), (100, 2_000, 0.5, True),
)


def config(devices: int, per_device: int, epsilon: float, secure: bool, replicates: int,
           seed: int) -> SimConfig:
    """The simulation of one row (module docstring)."""
    extra = {"secure_aggregation": True, "max_dropout": 0.1, "stage_timeout": 600.0} if secure else {}
    return SimConfig(devices=devices, records=devices * per_device, epsilon=epsilon, rounds=0,
                     replicates=replicates, seed=seed, **extra)


def run(replicates: int, seeds: int, only: int | None) -> list[dict]:
    """Plan and run every configuration (the first ``only`` of them if given) for each seed (of
    the data, Ω and the decoder): one row per run."""
    rows, data = [], {}
    for devices, per_device, epsilon, secure in CONFIGS[:only]:
        for seed in range(seeds):
            rows.append(run_one(devices, per_device, epsilon, secure, replicates, seed, data))
    return rows


def run_one(devices: int, per_device: int, epsilon: float, secure: bool, replicates: int, seed: int,
            data: dict) -> dict:
    """Plan one configuration, run it, and say both; ``data`` caches the pooled records."""
    cfg = config(devices, per_device, epsilon, secure, replicates, seed)
    spec = _study_spec(cfg)
    plan = plan_study(spec, per_device, decoder_threshold(spec.sketch, np.array(spec.lo), np.array(spec.hi)))
    if (cfg.records, seed) not in data:
        data[cfg.records, seed] = pooled_data(cfg)
    t = time.perf_counter()
    report = run_simulation(cfg, data[cfg.records, seed])
    z = report["identifiability"]["z"]
    row = {"devices": devices, "per_device": per_device, "epsilon": epsilon, "secure": secure, "seed": seed,
           "draws": plan.draws, "predicted_z": plan.z, "threshold": plan.threshold,
           "noise_to_signal": plan.noise_to_signal, "verdict": plan.verdict,
           "relative_sse": report["relative_sse"], "decoder": report["identifiability"]["status"],
           "median_z": statistics.median(z), "min_z": min(z), "seconds": time.perf_counter() - t}
    print(row, flush=True)
    return row


def table(rows: list[dict]) -> None:
    """The Markdown table of RESULTS.md: one line per configuration, its seeds together."""
    print("\n| L | n per device | ε | noise draws | predicted z / threshold | ‖e‖/‖s‖ | planner | "
          "measured median z − predicted z | decoder: identified | relative SSE (each seed) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["devices"], r["per_device"], r["epsilon"], r["secure"]), []).append(r)
    for (devices, per_device, epsilon, secure), runs in groups.items():
        noise = f"{runs[0]['draws']:.2f} (secure)" if secure else f"{runs[0]['draws']:.0f} (local)"
        ratio = " / ".join(f"{r['predicted_z']:.1f} / {r['threshold']:.1f}" for r in runs[:1])
        verdicts = sorted({r["verdict"] for r in runs})
        lift = statistics.median(r["median_z"] - r["predicted_z"] for r in runs)
        ident = sum(r["decoder"] == "identified" for r in runs)
        sse = ", ".join(f"{r['relative_sse']:.2f}" for r in runs)
        print(f"| {devices} | {per_device:,} | {epsilon:g} | {noise} | {ratio} | "
              f"{runs[0]['noise_to_signal']:.2f} | {' / '.join(verdicts)} | {lift:+.1f} | "
              f"{ident} of {len(runs)} | {sse} |")
    for verdict in ("hopeless", "doubtful", "expected to work"):
        sel = [r for r in rows if r["verdict"] == verdict]
        if sel:
            print(f"\n{verdict}: {len(sel)} runs, relative SSE median "
                  f"{statistics.median(r['relative_sse'] for r in sel):.2f}, range "
                  f"{min(r['relative_sse'] for r in sel):.2f}–{max(r['relative_sse'] for r in sel):.2f}, "
                  f"decoder identified {sum(r['decoder'] == 'identified' for r in sel)}")


def plot(rows: list[dict], path: Path) -> None:
    """Relative SSE against predicted z / threshold, marked by the decoder's verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for status, marker in (("identified", "o"), ("not identifiable", "x")):
        for secure, colour in ((False, "tab:blue"), (True, "tab:orange")):
            pts = [(r["predicted_z"] / r["threshold"], r["relative_sse"]) for r in rows
                   if r["decoder"] == status and r["secure"] == secure]
            if pts:
                ax.scatter(*zip(*pts, strict=True), marker=marker, color=colour,
                           label=f"{'secure' if secure else 'local noise'}, decoder: {status}")
    ax.axvline(1.0, color="grey", ls="--", lw=0.8)
    ax.axvline(SAFETY, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"predicted z / decoder threshold (planner: hopeless below 1, expected to work "
                  f"from {SAFETY:g})")
    ax.set_ylabel("measured relative SSE")
    ax.set_title("Planner vs federated runs (k = d = 10, m = 1000, sketch alone)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicates", type=int, default=3, help="CL-OMPR replicates (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per configuration (default: %(default)s)")
    ap.add_argument("--only", type=int, default=None, help="run the first N configurations only")
    ap.add_argument("--plot", type=Path, default=PLOTS / "planner.png", help="plot (default: %(default)s)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = run(args.replicates, args.seeds, args.only)
    table(rows)
    plot(rows, args.plot)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
