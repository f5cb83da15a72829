"""Federated accuracy end to end: ``fedsketch simulate`` as a process, over TLS on loopback.

Paper 004's GMM (k = d = 10, separation 2.5), m = 10kd, r = 1, replace-one, σ = 2, 3 replicates,
relative SSE against scikit-learn KMeans (n_init = 3) on the pooled data; medians over seeds:

    A  20 in-process devices, N = 10^6, ε = 1 per device
    B  5 daemon processes (``--processes``), N = 10^6, ε = 1 per device
    C  100 in-process devices, N = 10^7, ε = 0.1 per device

Usage: python benchmarks/bench_federated.py [--seeds 5] [--only A|B|C]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CASES = {
    "A": ("20 devices, N = 10^6, ε = 1", ["--devices", "20", "--records", "1000000",
                                           "--epsilon", "1"]),
    "B": ("5 daemon processes, N = 10^6, ε = 1", ["--devices", "5", "--records", "1000000",
                                                   "--epsilon", "1", "--processes"]),
    "C": ("100 devices, N = 10^7, ε = 0.1", ["--devices", "100", "--records", "10000000",
                                              "--epsilon", "0.1"]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--only", choices=sorted(CASES))
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("fedsketch"))
    rows = []
    for name, (label, flags) in CASES.items():
        if args.only and name != args.only:
            continue
        rel, wall, sent = [], [], []
        for seed in range(args.seeds):
            res = subprocess.run([exe, "simulate", *flags, "--seed", str(seed), "--json"],
                                 capture_output=True, text=True, check=True)
            report = json.loads(res.stdout)
            rel.append(report["relative_sse"])
            wall.append(sum(v for k, v in report["seconds"].items()
                            if k != "data_and_kmeans_reference"))
            sent.append(report["bytes_sent"])
            print(f"{name} seed {seed}: relative SSE {rel[-1]:.4f}, {wall[-1]:.1f} s, "
                  f"{sent[-1]:,} bytes, phases {report['seconds']}", flush=True)
        rows.append((label, rel, wall, sent))
    print(f"\n| case ({args.seeds} seeds) | median relative SSE | min | max | median wall s "
          "(no k-means) | bytes on the wire |")
    print("|---|---|---|---|---|---|")
    for label, rel, wall, sent in rows:
        print(f"| {label} | {statistics.median(rel):.4f} | {min(rel):.4f} | {max(rel):.4f} | "
              f"{statistics.median(wall):.1f} | {statistics.median(sent):,.0f} |")


if __name__ == "__main__":
    main()
