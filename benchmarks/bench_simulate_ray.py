"""``simulate --backend ray`` at size: L plain devices and L' secure devices as Ray actors on a
local Ray (this machine's cores), against the in-process backend where asked.

Paper 004's data (k = d = 10, separation 2.5), ``--per-device`` (100) records per device, m =
``--m`` (1000), the complex map, r = 1, ε = 1 per device, one CL-OMPR replicate; the secure runs
use the sparse SecAgg+ graph of degree ⌈3·log2 L⌉ (as ``bench_secagg.py cost``) and no dropouts.
Prints one JSON line per run: the phases' seconds (enroll, devices, decode), relative SSE, the
Ray actors' peak resident sets and their growth per device (VmHWM at the actor's start and after
the round), the driver's peak resident set (coordinator, data, k-means reference), and the
load average before and after (the machine is shared: say so with the numbers).

Usage: nice -n 15 python benchmarks/bench_simulate_ray.py [--plain 10000] [--secure 1000]
           [--per-device 100] [--m 1000] [--backends ray inprocess]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.ray_devices import peak_rss_bytes
from fedsketch.server.sim.simulate import run_simulation


def run(devices: int, secure: bool, per_device: int, m: int, backend: str) -> dict:
    cfg = SimConfig(devices=devices, records=devices * per_device, k=10, d=10, m=m, epsilon=1.0,
                    replicates=1, secure_aggregation=secure, backend=backend,
                    degree=min(devices - 1, math.ceil(3 * math.log2(devices))) if secure else None)
    load, t = os.getloadavg(), time.perf_counter()
    report = run_simulation(cfg)
    return {"backend": backend, "devices": devices, "secure": secure, "records": cfg.records,
            "m": m, "degree": cfg.degree, "relative_sse": report["relative_sse"],
            "decoded_devices": report["devices"], "seconds": report["seconds"],
            "wall_seconds": time.perf_counter() - t, "ray": report["ray"],
            "driver_peak_rss_bytes": peak_rss_bytes(), "bytes_sent": report["bytes_sent"],
            "load_before": load, "load_after": os.getloadavg(), "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", type=int, default=10_000)
    parser.add_argument("--secure", type=int, default=1000)
    parser.add_argument("--per-device", type=int, default=100)
    parser.add_argument("--m", type=int, default=1000)
    parser.add_argument("--backends", nargs="+", default=["ray"])
    args = parser.parse_args()
    for backend in args.backends:
        for devices, secure in ((args.plain, False), (args.secure, True)):
            if devices:
                print(json.dumps(run(devices, secure, args.per_device, args.m, backend)), flush=True)


if __name__ == "__main__":
    main()
