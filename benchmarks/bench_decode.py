"""CL-OMPR decoding speed and quality, against pycle 1.2's ``CLOMP_CKM.fit_once`` in the same run.

Both decoders get the same noiseless sketch of a paper-004 GMM (k = d = 10, n = 10^5), the same
Ω and ξ (m = 1000, σ = 2), the same box [−15, 15]^10, one replicate each, and BLAS pinned to one
thread (pycle with two OpenBLAS threads is many times slower on 2 cores; DESIGN §8). Each run
uses another dataset seed; each decoder is timed ``--repeats`` times on it, alternating (the
same generator seed each time, so the same decoding), and the run keeps the median. The table
gives median wall and CPU seconds, pycle's over ours, and median relative SSE against
scikit-learn KMeans (k-means++, n_init = 3) on the same data; then the CPU and the load averages
before and after (the benchmark machine is shared: the ratio, measured in the same run, is the
figure to compare).

The decoder's loops are compiled by numba (server/decode/kernels.py) and cached on disk; the
first decode of a process loads them (or, the first time on a machine, compiles them). That
first call is timed apart and printed first, not counted in the medians; ``--cold`` points
numba's cache at an empty folder, so that it is the compilation.

Usage: python benchmarks/bench_decode.py [--runs 5] [--repeats 3] [--cold]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.clompr import clompr

K = D = 10
M, N, SIGMA, BOUND = 1000, 100_000, 2.0, 15.0


def _timed(fn: Callable[[], np.ndarray]) -> tuple[float, float, np.ndarray]:
    """(wall seconds, CPU seconds of this process, fn's centroids)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def one_run(seed: int, repeats: int) -> dict[str, float]:
    import pycle.compressive_learning as cl
    import pycle.sketching as pysk

    x, _, _ = gmm(N, K, D, 2.5, seed)
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, K, seed))
    freqs = draw_frequencies(FrequencySpec(d=D, m=M, scale=SIGMA, seed=seed))
    sketch = privatize(feature_sum(split(x), freqs, "complex"), PrivacySpec(float("inf"))).sketch
    lo, hi = np.full(D, -BOUND), np.full(D, BOUND)
    phi = pysk.SimpleFeatureMap("ComplexExponential", np.array(freqs.omega), np.array(freqs.xi),
                                c_norm="unit")

    def ours() -> np.ndarray:
        return clompr(sketch, freqs.omega, freqs.xi, K, lo, hi,
                      rng=np.random.default_rng(seed)).centroids

    def theirs() -> np.ndarray:
        solver = cl.CLOMP_CKM(phi, K, np.stack([lo, hi]), sketch)
        np.random.seed(seed)
        with threadpool_limits(1):
            solver.fit_once()
        return np.asarray(solver.current_sol[1])

    times: dict[str, list[float]] = {"ours_s": [], "ours_cpu": [], "pycle_s": [], "pycle_cpu": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("pycle", theirs)):
            wall, cpu, centroids = _timed(fn)
            times[f"{name}_s"].append(wall)
            times[f"{name}_cpu"].append(cpu)
            rel = sse_per_n(split(x), centroids) / ref
            times.setdefault(f"{name}_rel", []).append(rel)
    return {key: statistics.median(v) for key, v in times.items()}


def first_call() -> tuple[float, float]:
    """(wall s, CPU s) of the process's first decode, on a small problem (d = 2, m = 64, k = 2):
    numba's import and the compiled loops' load or compilation, nearly all of it."""
    rng = np.random.default_rng(0)
    omega, xi = rng.normal(size=(2, 64)), rng.uniform(0, 2 * np.pi, 64)
    sketch = np.exp(1j * (np.array([[1.0, -1.0], [-1.0, 1.0]]) @ omega + xi)).mean(axis=0) / 8
    wall, cpu, _ = _timed(lambda: clompr(sketch, omega, xi, 2, np.full(2, -3.0), np.full(2, 3.0),
                                         rng=np.random.default_rng(1)).centroids)
    return wall, cpu


def _cpu() -> str:
    """The CPU's model name and count (``lscpu``), or the platform's word for it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true",
                    help="compile the decoder's loops into an empty numba cache folder first")
    args = ap.parse_args()
    if args.cold:  # read by numba when the first decode imports it
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-decode-numba-")
    load_before = os.getloadavg()
    first = first_call()
    how = ("compiling into an empty cache" if args.cold
           else "loading the compiled loops from the disk cache")
    print(f"first decode of the process ({how}): {first[0]:.2f} s wall, {first[1]:.2f} CPU s",
          flush=True)
    rows = []
    for seed in range(args.runs):
        rows.append(one_run(seed, args.repeats))
        r = rows[-1]
        print(f"seed {seed}: fedsketch {r['ours_s']:.3f} s (relative SSE {r['ours_rel']:.4f}), "
              f"pycle {r['pycle_s']:.3f} s (relative SSE {r['pycle_rel']:.4f}), "
              f"ratio {r['pycle_s'] / r['ours_s']:.1f}x", flush=True)
    med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    print(f"\n| CL-OMPR, k = d = {K}, m = {M}, 1 replicate ({args.runs} runs × {args.repeats}) | "
          "fedsketch | pycle fit_once | ratio |")
    print("|---|---|---|---|")
    print(f"| median wall s | {med['ours_s']:.3f} | {med['pycle_s']:.3f} | "
          f"{med['pycle_s'] / med['ours_s']:.1f}x |")
    print(f"| median CPU s | {med['ours_cpu']:.3f} | {med['pycle_cpu']:.3f} | "
          f"{med['pycle_cpu'] / med['ours_cpu']:.1f}x |")
    print(f"| median relative SSE | {med['ours_rel']:.4f} | {med['pycle_rel']:.4f} | |")
    load_after = os.getloadavg()
    print(f"\nCPU: {_cpu()}; load average (1, 5, 15 min) before "
          f"{', '.join(f'{v:.1f}' for v in load_before)}, after "
          f"{', '.join(f'{v:.1f}' for v in load_after)} (a shared machine: other jobs ran too)")


if __name__ == "__main__":
    main()
