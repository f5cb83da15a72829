"""Federated accuracy end to end: ``fedsketch simulate`` as a process, over TLS on loopback.

Paper 004's GMM (k = d = 10, separation 2.5), m = 10kd, r = 1, replace-one, σ = 2,
``--replicates`` (3) CL-OMPR replicates, relative SSE against scikit-learn KMeans (n_init = 3)
on the pooled data, the sketch alone (``--rounds 0``; refinement rounds are measured by
``bench_realdata_federated.py``); medians over ``--seeds`` (5) seeds:

    A  20 in-process devices, N = 10^6, ε = 1 per device
    B  5 daemon processes (``--processes``), N = 10^6, ε = 1 per device
    C  100 in-process devices, N = 10^7, ε = 0.1 per device

``--n`` replaces every case's N (e.g. a smoke run: --seeds 1 --n 20000 --replicates 1).
Usage: python benchmarks/bench_federated.py [--seeds 5] [--only A|B|C] [--n N] [--replicates 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

#: name: (devices, records N, ε per device, daemon processes)
CASES = {
    "A": (20, 1_000_000, 1.0, False),
    "B": (5, 1_000_000, 1.0, True),
    "C": (100, 10_000_000, 0.1, False),
}


def label(devices: int, records: int, eps: float, processes: bool) -> str:
    return f"{devices} {'daemon processes' if processes else 'devices'}, N = {records:,}, ε = {eps:g}"


def run_case(exe: str, name: str, devices: int, records: int, eps: float, processes: bool,
             seeds: int, replicates: int) -> tuple[list[float], list[float], list[int]]:
    """Relative SSE, wall seconds without the k-means reference, and bytes sent, per seed."""
    flags = ["--devices", str(devices), "--records", str(records), "--epsilon", repr(eps), "--rounds", "0",
             "--replicates", str(replicates), *(["--processes"] if processes else [])]
    rel, wall, sent = [], [], []
    for seed in range(seeds):
        res = subprocess.run([exe, "simulate", *flags, "--seed", str(seed), "--json"],
                             capture_output=True, text=True, check=True)
        report = json.loads(res.stdout)
        rel.append(report["relative_sse"])
        wall.append(sum(v for k, v in report["seconds"].items()
                        if k != "data_and_kmeans_reference"))
        sent.append(report["bytes_sent"])
        print(f"{name} seed {seed}: relative SSE {rel[-1]:.4f}, {wall[-1]:.1f} s, "
              f"{sent[-1]:,} bytes, phases {report['seconds']}", flush=True)
    return rel, wall, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=5,
                    help="datasets per case, seeds 0 to S - 1 (default: %(default)s)")
    ap.add_argument("--only", choices=sorted(CASES), help="run this case alone")
    ap.add_argument("--n", type=int, help="records N of every case (default: 10^6 for A and B, "
                                          "10^7 for C)")
    ap.add_argument("--replicates", type=int, default=3,
                    help="CL-OMPR replicates per decoding (default: %(default)s)")
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("fedsketch"))
    rows = []
    for name, (devices, records, eps, processes) in CASES.items():
        if args.only and name != args.only:
            continue
        case = (devices, args.n or records, eps, processes)
        rows.append((label(*case), *run_case(exe, name, *case, args.seeds, args.replicates)))
    print(f"\n| case ({args.seeds} seeds) | median relative SSE | min | max | median wall s "
          "(no k-means) | bytes on the wire |")
    print("|---|---|---|---|---|---|")
    for case_label, rel, wall, sent in rows:
        print(f"| {case_label} | {statistics.median(rel):.4f} | {min(rel):.4f} | {max(rel):.4f} | "
              f"{statistics.median(wall):.1f} | {statistics.median(sent):,.0f} |")


if __name__ == "__main__":
    main()
