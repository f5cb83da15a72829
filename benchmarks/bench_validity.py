"""What proving every input in range costs (issue 32, design (a) of docs/bounded-influence.md).

Each of L devices (``--devices``, 100 and 1000) holds a random integer vector of 2m = 2,000
entries (m = ``--m``, 1000, the simulator's default) within ±B, B = 2^28 − 1: the bound a cap of
200,000 records implies (γ·N_max = 1,024 × 200,000 ≈ 2.05·10^8, plus its noise share's radius,
below 2^28 ≈ 2.68·10^8), and shards it with R = 3 proofs (`ProvenInput.shard`); the two
aggregators then prepare every report and decide. ``--l1`` adds an L1 bound (at 1/4 of the
largest, 2m·B/4) for the smaller L. Timings are CPU seconds of this process with BLAS held to
one thread (``threadpoolctl``), so they do not depend on the other core: per device, the median
over its L shards (including encoding); per aggregator, the sum over all L reports of its
``prepare`` (the helper's includes expanding its seeds), and of ``decide``. Bytes: field
elements as 4-byte words, seeds 16 bytes, plus the 16-byte report nonce; the message each
aggregator sends the other per report (verifier shares and two 16-byte parts).

Usage: python benchmarks/bench_validity.py [--devices 100 1000] [--m 1000] [--l1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from fedsketch.common.validity import circuit, sharing

BOUND = 2**28 - 1


def run(devices: int, m: int, l1: bool) -> dict:
    n = 2 * m
    circ = circuit.RangeCircuit(n, BOUND, n * BOUND // 4 if l1 else None)
    proven = sharing.ProvenInput(circ)
    rng = np.random.default_rng(devices)
    key = os.urandom(16)
    proven.shard(np.zeros(n, dtype=np.int64), b"warm")  # build the Lagrange matrices once
    reports, prove_seconds = [], []
    for _ in range(devices):
        x = rng.integers(-BOUND // 4, BOUND // 4 + 1, n) if l1 else rng.integers(
            -BOUND, BOUND + 1, n)
        nonce = os.urandom(16)
        start = time.process_time()
        shares = proven.shard(x, nonce)
        prove_seconds.append(time.process_time() - start)
        reports.append((nonce, *shares))
    seconds = {"leader": 0.0, "helper": 0.0, "decide": 0.0}
    messages = []
    for role, index in (("leader", 1), ("helper", 2)):
        start = time.process_time()
        messages.append([proven.prepare(report[index], key, report[0]) for report in reports])
        seconds[role] = time.process_time() - start
    start = time.process_time()
    accepted = sum(proven.decide(a, b) for a, b in zip(*messages, strict=True))
    seconds["decide"] = time.process_time() - start
    sizes = proven.report_bytes()
    return {
        "L": devices, "l1": l1, "elements": circ.length, "chunk": proven.flp.chunk,
        "calls": proven.flp.calls, "proof_len": proven.flp.proof_len,
        "device_s": statistics.median(prove_seconds),
        "bytes_leader": sizes["leader"] + 16, "bytes_helper": sizes["helper"] + 16,
        "exchange_bytes": 4 * proven.proofs * proven.flp.verifier_len + 32,
        "leader_s": seconds["leader"], "helper_s": seconds["helper"],
        "decide_s": seconds["decide"], "accepted": accepted,
        "soundness_log2": proven.soundness_log2(),
        "soundness_log2_q40": proven.soundness_log2(2**40),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--m", type=int, default=1000)
    parser.add_argument("--l1", action="store_true", help="also the L1 bound, at the smaller L")
    args = parser.parse_args()
    rows = [(L, False) for L in args.devices] + ([(min(args.devices), True)] if args.l1 else [])
    print("| L | L1 bound | encoded elements | c, M | proof elements ×3 | device CPU s | "
          "bytes to leader | bytes to helper | leader CPU s (all L) | helper CPU s (all L) | "
          "decide s (all L) | exchange bytes per report | accepted | log2 soundness (Q = 1; 2^40) |")
    print("|---" * 14 + "|")
    with threadpool_limits(1):
        for devices, l1 in rows:
            r = run(devices, args.m, l1)
            print(f"| {r['L']} | {'2m·B/4' if r['l1'] else 'none'} | {r['elements']:,} | "
                  f"{r['chunk']}, {r['calls']} | {3 * r['proof_len']:,} | {r['device_s']:.3f} | "
                  f"{r['bytes_leader']:,} | {r['bytes_helper']} | {r['leader_s']:.2f} | "
                  f"{r['helper_s']:.2f} | {r['decide_s']:.3f} | {r['exchange_bytes']:,} | "
                  f"{r['accepted']}/{r['L']} | {r['soundness_log2']:.1f}; "
                  f"{r['soundness_log2_q40']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
