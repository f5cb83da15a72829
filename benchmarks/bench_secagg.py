"""Secure aggregation against per-device (local) noise, and what it costs.

utility: paper 004's data (k = d = 10, separation 2.5), L = ``--devices`` (100) in-process
    devices over TLS, N = ``--n`` (10^7), m = 10kd, ``quantized``, r = 1, replace-one,
    ``--replicates`` (3) CL-OMPR replicates, ε per device on a grid; secure aggregation (full
    graph, h_min = L: one central DLap draw) against the local-noise mode (each device adds its
    own DLap: L draws). The data and the KMeans reference (n_init = 3) are made once per seed and
    shared by every run. Prints medians over ``--seeds`` (5) seeds, the ε at which each mode
    crosses relative SSE 1.2 (log-linear interpolation), and writes a plot to ``--plot``
    (benchmarks/plots/secagg_utility.png).
cost: m = 1000, 10^3 records per device, L and a larger L (``--devices``, 100 and 1000), sparse
    SecAgg+ graph of degree ⌈3·log2 L⌉ (and the full graph at the smaller L; for L ≤ 13 that
    degree is at least L - 1, so the "sparse" graph is the full one), with no stated dropouts or
    colluders, and once more at the larger L stating D = ⌈0.005·L⌉ dropouts and C = ⌈0.002·L⌉
    colluders (none happen): per-device CPU seconds of its own thread (sketching, noise, masks,
    crypto, the committee signatures it verifies; median over devices), bytes each device sends
    (median), the signing committee p and its quorum q, and the coordinator's seconds to close
    each stage.
stages: how long each stage of a secure round stays open when nothing times out: `fedsketch
    simulate`'s in-process devices (each stepped in turn, so a stage lasts the sum of every
    device's step), L = ``--devices`` (20 and 100), N = ``--n`` (10^6) records, m = 1000, the
    complex map, ε = 0.5, stage timeout 600 s, ``--runs`` (3) runs each; prints each stage's
    largest open seconds over the runs, and the whole device phase (data work included). What
    the simulator's default stage timeout is sized from (docs/secure-aggregation.md).

Usage: python benchmarks/bench_secagg.py utility [--seeds 5] [--devices 100] [--n 10000000]
           [--replicates 3] [--plot PATH] [--secure-eps 0.002,...] [--local-eps 0.01,...]
       python benchmarks/bench_secagg.py cost [--devices 100 1000]
       python benchmarks/bench_secagg.py stages [--devices 20 100] [--n 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.sim.devices import make_agents
from fedsketch.server.sim.simulate import (
    SimConfig,
    _study_spec,
    loopback_coordinator,
    pooled_data,
    run_simulation,
    split_records,
)

PLOTS = Path(__file__).resolve().parent / "plots"
SECURE_EPS = (0.002, 0.005, 0.01, 0.02)
LOCAL_EPS = (0.01, 0.02, 0.05, 0.1, 0.2)


def crossing(eps: list[float], rel: list[float], level: float = 1.2) -> float | None:
    """Smallest ε where the median relative SSE falls to ``level`` (log-linear interpolation)."""
    pts = sorted(zip(eps, rel, strict=True))
    for (e0, r0), (e1, r1) in zip(pts, pts[1:], strict=False):
        if r0 > level >= r1:
            t = (r0 - level) / (r0 - r1)
            return math.exp(math.log(e0) + t * (math.log(e1) - math.log(e0)))
    return pts[0][0] if pts and pts[0][1] <= level else None


def utility(seeds: int, devices: int, records: int, replicates: int, plot_path: Path,
            grids: dict[str, tuple[float, ...]]) -> None:
    base = dict(devices=devices, records=records, m=1000, feature="quantized", r=1,
                replicates=replicates)
    results: dict[tuple[str, float], list[float]] = {}
    for seed in range(seeds):
        data = pooled_data(SimConfig(**base, seed=seed))
        for mode, grid in grids.items():
            for eps in grid:
                cfg = SimConfig(**base, seed=seed, epsilon=eps,
                                secure_aggregation=mode == "secure", stage_timeout=120)
                rel = run_simulation(cfg, data=data)["relative_sse"]
                results.setdefault((mode, eps), []).append(rel)
                print(f"seed {seed} {mode} ε = {eps:g}: relative SSE {rel:.4f}", flush=True)
    print(f"\n| mode (L = {devices}, N = {records:,}, quantized, r = 1; {seeds} seeds) | ε per device | "
          "median relative SSE | min | max |")
    print("|---|---|---|---|---|")
    medians = {}
    for (mode, eps), vals in sorted(results.items()):
        medians.setdefault(mode, ([], []))
        medians[mode][0].append(eps)
        medians[mode][1].append(statistics.median(vals))
        print(f"| {mode} | {eps:g} | {statistics.median(vals):.4f} | {min(vals):.4f} | "
              f"{max(vals):.4f} |")
    for mode, (eps, rel) in medians.items():
        cross = crossing(eps, rel)
        print(f"{mode}: ε for relative SSE 1.2 ≈ {cross:.3g}" if cross else
              f"{mode}: does not reach 1.2 on the grid")
    plot(medians, plot_path, f"L = {devices} devices, N = {records:,}, quantized, m = 10kd, r = 1")


def plot(medians: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, (eps, rel) in medians.items():
        ax.plot(eps, rel, marker="o", label={"secure": "secure aggregation (one DLap)",
                                             "local": "local noise (L DLap draws)"}[mode])
    ax.axhline(1.2, color="grey", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε per device")
    ax.set_ylabel("relative SSE (median)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def cost_once(devices: int, degree: int | None, dropout: float = 0.0,
              colluders: float = 0.0) -> dict:
    """One secure round with thread-CPU accounting per device (in-process devices), stating
    the fractions ``dropout`` and ``colluders`` of the devices."""
    cfg = SimConfig(devices=devices, records=1000 * devices, m=1000, feature="quantized", r=1,
                    epsilon=1.0, secure_aggregation=True, degree=degree, stage_timeout=600,
                    max_dropout=dropout, max_colluders=colluders)
    spec = _study_spec(cfg)
    params = spec.round_params("cost", tuple(f"{i:05d}" for i in range(devices)))
    x, labels, _ = gmm(cfg.records, cfg.k, cfg.d, cfg.separation, cfg.seed)  # no reference needed
    parts = split_records(labels, devices, "iid", np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        loop = loopback_coordinator(stack, Path(tmp))
        op, meta = loop.operator, loop.meta
        tokens = list(op.IssueTokens(pb.IssueTokensRequest(count=devices), metadata=meta).tokens)
        study = op.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), metadata=meta)
        agents = make_agents(stack, loop.target, loop.certs.ca_cert, Path(tmp), tokens,
                             [x[idx] for idx in parts], 1.0)
        cpu = [0.0] * devices
        t = time.perf_counter()
        while op.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=meta).state not in (
                pb.DONE, pb.FAILED):
            for i, agent in enumerate(agents):
                c = time.thread_time()
                agent.step()
                cpu[i] += time.thread_time() - c
        wall = time.perf_counter() - t
        state = op.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=meta)
        return {"devices": devices, "degree": degree, "state": pb.StudyState.Name(state.state),
                "dropouts": spec.secure_aggregation.dropouts,
                "colluders": spec.secure_aggregation.colluders,
                "committee": params.committee_size, "quorum": params.consistency_quorum,
                "device_cpu_s": statistics.median(cpu),
                "device_bytes": statistics.median(a.bytes_sent for a in agents),
                "coordinator_s": loop.coordinator.rounds[study.study_id].stage_seconds, "wall_s": wall}


def cost(small: int, large: int) -> None:
    rows = []
    sparse = math.ceil(3 * math.log2(large))
    for args in ((small, None), (small, math.ceil(3 * math.log2(small))), (large, sparse),
                 (large, sparse, 0.005, 0.002)):
        r = cost_once(*args)
        rows.append(r)
        print(r, flush=True)
    print("\n| L | graph | D, C | state | per-device CPU s (median) | bytes sent per device "
          "(median) | committee p, quorum q | coordinator s per stage | round wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        stages = ", ".join(f"{k.lower()} {v:.2f}" for k, v in r["coordinator_s"].items())
        graph = "full" if r["degree"] is None else f"degree {r['degree']}"
        print(f"| {r['devices']} | {graph} | {r['dropouts']}, {r['colluders']} | "
              f"{r['state']} | {r['device_cpu_s']:.3f} | {r['device_bytes']:,.0f} | "
              f"{r['committee']}, {r['quorum']} | {stages} | {r['wall_s']:.1f} |")
    sparse = [r for r in rows if r["degree"] is not None]
    growth = sparse[1]["device_cpu_s"] / sparse[0]["device_cpu_s"]
    print(f"\nsparse graph: per-device CPU grows {growth:.2f}x from L = {small} to L = {large}")


def stages(devices: list[int], records: int, runs: int) -> None:
    """The stage timings of the module docstring's ``stages``."""
    rows = []
    for n_dev in devices:
        cfg = SimConfig(devices=n_dev, records=records, m=1000, epsilon=0.5,
                        secure_aggregation=True, stage_timeout=600.0)
        data = pooled_data(cfg)
        reports = [run_simulation(cfg, data) for _ in range(runs)]
        opened = [r["secure_aggregation"]["stage_open_seconds"] for r in reports]
        rows.append((n_dev, {k: max(o[k] for o in opened) for k in opened[0]},
                     max(r["seconds"]["devices"] for r in reports)))
        print(rows[-1], flush=True)
    names = list(rows[0][1])
    print(f"\n| L | {' | '.join(n.lower() for n in names)} | device phase |")
    print("|---" * (len(names) + 2) + "|")
    for n_dev, opened, phase in rows:
        print(f"| {n_dev} | {' | '.join(f'{opened[n]:.2f}' for n in names)} | {phase:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    parts = ap.add_subparsers(dest="part", required=True)
    util = parts.add_parser("utility", help="relative SSE against ε, secure vs local noise")
    util.add_argument("--seeds", type=int, default=5,
                      help="datasets, seeds 0 to S - 1 (default: %(default)s)")
    util.add_argument("--devices", type=int, default=100, help="devices L (default: %(default)s)")
    util.add_argument("--n", type=int, default=10_000_000,
                      help="records N, split over the devices (default: %(default)s)")
    util.add_argument("--replicates", type=int, default=3,
                      help="CL-OMPR replicates per decoding (default: %(default)s)")
    util.add_argument("--plot", type=Path, default=PLOTS / "secagg_utility.png",
                      help="plot file (default: %(default)s)")
    for mode, grid in (("secure", SECURE_EPS), ("local", LOCAL_EPS)):
        util.add_argument(f"--{mode}-eps", type=lambda t: tuple(float(e) for e in t.split(",")),
                          default=grid, help=f"the {mode} study's ε grid, comma-separated "
                          f"(default: {','.join(f'{e:g}' for e in grid)})")
    cst = parts.add_parser("cost", help="per-device CPU and bytes, coordinator seconds per stage")
    cst.add_argument("--devices", type=int, nargs=2, default=[100, 1000], metavar=("L", "L_LARGE"),
                     help="the two device counts compared (default: %(default)s)")
    stg = parts.add_parser("stages", help="each stage's open seconds in the simulator")
    stg.add_argument("--devices", type=int, nargs="+", default=[20, 100],
                     help="device counts L (default: %(default)s)")
    stg.add_argument("--n", type=int, default=1_000_000,
                     help="records N, split over the devices (default: %(default)s)")
    stg.add_argument("--runs", type=int, default=3, help="runs per L (default: %(default)s)")
    args = ap.parse_args()
    if args.part == "utility":
        utility(args.seeds, args.devices, args.n, args.replicates, args.plot,
                {"secure": args.secure_eps, "local": args.local_eps})
    elif args.part == "stages":
        stages(args.devices, args.n, args.runs)
    else:
        cost(*args.devices)


if __name__ == "__main__":
    main()
