"""Sketching speed and memory, against pycle 1.2 measured in the same run.

1. r = m, m = 1000, d = 10: records/s of ``feature_sum`` vs pycle's ``computeSketch`` on the same
   in-memory data and the same Ω (pycle uses float64 complex exponentials), and vs the machine's
   limit: numpy's float32 cos and sin alone of as many phases, on every core (the sketch's
   threads and 8192-row tasks, 256-row blocks), i.e. the trigonometry with nothing else, printed
   as a ratio; beside it the numpy-only path the fused kernel replaced (with and without numba),
   and each path's deviation from float64 in grid steps.
2. r = 1 (``complex`` and ``quantized``): records/s streaming a 10^7 × 10 float32 ``.npy`` file,
   file reading included, against the naive baseline of computing all m entries (r = m) per record.
3. Peak RSS of ``fedsketch sketch`` on that file (GNU time ``%M``), against the file's size.

Each figure is the median of ``--runs`` runs.
Usage: python benchmarks/bench_sketch.py [--quick] [--trig-only] [--runs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsketch.common.data.dataio import DataSource, write_npy_stream
from fedsketch.common.data.synthetic import gmm_chunks
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.sketching import feature_sum

OUT = Path(__file__).resolve().parent / "out"


def median_time(fn, runs: int) -> float:
    """Median wall seconds of ``fn()`` over ``runs`` calls after one warm-up."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def data_file(n: int, d: int, k: int) -> Path:
    """A paper-004 GMM file of n float32 records, made once and kept in benchmarks/out/."""
    OUT.mkdir(exist_ok=True)
    path = OUT / f"gmm_n{n}_d{d}_k{k}.npy"
    if not path.exists():
        _, chunks = gmm_chunks(n, k, d, 2.5, seed=0)
        write_npy_stream(path, n, d, (x for x, _ in chunks))
    return path


def vs_pycle(n: int, m: int, d: int, runs: int) -> dict:
    """Throughput at r = m against pycle's computeSketch, same data and Ω."""
    import pycle.sketching as pysk

    x = np.random.default_rng(0).normal(0, 3, (n, d)).astype(np.float32)
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=1.0, dither=False))
    phi = pysk.SimpleFeatureMap("ComplexExponential", freqs.omega, c_norm="unit")
    x64 = x.astype(np.float64)
    ours = median_time(lambda: feature_sum([x], freqs, "complex"), runs)
    theirs = median_time(lambda: pysk.computeSketch(x64, phi), runs)
    ref = pysk.computeSketch(x64, phi)  # c_norm = "unit" is our 1/√m normalization
    got = feature_sum([x], freqs, "complex").clean_sketch()
    return {
        "ours_rps": n / ours,
        "pycle_rps": n / theirs,
        "ratio": theirs / ours,
        "max_abs_diff": float(np.abs(ref - got).max()),
    }


def _numpy_path(x: np.ndarray, omega: np.ndarray, xi: np.ndarray, workers: int) -> None:
    """The r = m ``complex`` sum as it was before the fused kernel (numpy only, the same threads,
    8192-row tasks and 256-row blocks): matmul, + ξ, cos and sin, × γ, rint, float32 block sums."""
    m = omega.shape[1]
    g = np.float32(1024)

    def task(lo: int) -> np.ndarray:
        t = np.empty((256, m), dtype=np.float32)
        f = np.empty_like(t)
        acc = np.zeros((2, m))
        for start in range(lo, min(lo + 8192, x.shape[0]), 256):
            block = x[start:min(start + 256, lo + 8192, x.shape[0])]
            tb, fb = t[:block.shape[0]], f[:block.shape[0]]
            np.matmul(block, omega, out=tb)
            tb += xi
            for row, fn in enumerate((np.cos, np.sin)):
                fn(tb, out=fb)
                fb *= g
                acc[row] += np.add.reduce(np.rint(fb, out=fb), axis=0)
        return acc

    with threadpool_limits(1), ThreadPoolExecutor(max_workers=workers) as pool:
        sum(pool.map(task, range(0, x.shape[0], 8192)))


def vs_numpy_trig(n: int, m: int, d: int, runs: int) -> dict:
    """Throughput at r = m against numpy's float32 cos + sin on every core, interleaved runs.

    The limit: the same n·m phases' cos and sin in numpy float32, on the sketch's threads and
    task size (8192 rows per task, 256-row blocks in cache; each task reuses one precomputed
    8192 × m phase block, so the phases' own cost is not counted). Also the numpy-only path the
    fused kernel replaced, for the with/without-numba comparison. Medians of ``runs`` rounds,
    each timing the three in turn (the machine is shared: interleaving spreads load evenly).
    """
    x = np.random.default_rng(0).normal(0, 3, (n, d)).astype(np.float32)
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=1.0))
    om32, xi32 = freqs.omega.astype(np.float32), freqs.xi.astype(np.float32)
    phases = x[:8192] @ om32 + xi32
    workers = max(1, min(2, os.cpu_count() or 1))

    def trig(_: int) -> None:
        buf = np.empty((256, m), dtype=np.float32)
        for start in range(0, 8192, 256):
            np.cos(phases[start:start + 256], out=buf)
            np.sin(phases[start:start + 256], out=buf)

    def numpy_trig() -> None:
        with threadpool_limits(1), ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(trig, range(0, n, 8192)))

    fns = {"ours": lambda: feature_sum([x], freqs, "complex", workers=workers),
           "trig": numpy_trig, "numpy_path": lambda: _numpy_path(x, om32, xi32, workers)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up (compiles the kernel)
    for _ in range(runs):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    rounds = sorted(t / o for t, o in zip(times["trig"], times["ours"], strict=True))
    return {"ours_rps": n / med["ours"], "trig_rps": n / med["trig"],
            "numpy_path_rps": n / med["numpy_path"], "ratio": med["trig"] / med["ours"],
            "numpy_path_ratio": med["trig"] / med["numpy_path"], "workers": workers,
            "round_ratios": (rounds[0], statistics.median(rounds), rounds[-1]),
            "runs": {k: [round(n / t) for t in v] for k, v in times.items()}}


def accuracy(n: int, m: int, d: int) -> dict:
    """|Δ| in grid steps of γ·cos t and γ·sin t against float64 (float64 phases from the float64
    Ω, ξ), for the fused kernel (its numpy specification, bit-identical) and numpy's float32
    path; and the fraction of rounded integers that differ from the float64 ones."""
    from fedsketch.common.sketch.trig_kernel import FusedComplex

    x = np.random.default_rng(1).normal(0, 3, (n, d)).astype(np.float32)
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=1.0))
    t64 = x.astype(np.float64) @ freqs.omega + freqs.xi
    exact = 1024 * np.cos(t64), 1024 * np.sin(t64)
    t32 = x @ freqs.omega.astype(np.float32) + freqs.xi.astype(np.float32)
    g = np.float32(1024)
    paths = {"fused": FusedComplex(freqs.omega, freqs.xi, 1024).reference(x, rounded=False),
             "numpy": (g * np.cos(t32), g * np.sin(t32))}
    out = {}
    for name, got in paths.items():
        err = np.concatenate([np.abs(a - e).ravel() for a, e in zip(got, exact, strict=True)])
        differ = np.mean([np.mean(np.rint(a) != np.rint(e)) for a, e in zip(got, exact, strict=True)])
        out[name] = {"median": float(np.median(err)), "p99": float(np.quantile(err, 0.99)),
                     "max": float(err.max()), "differ": float(differ)}
    return out


def streaming(path: Path, m: int, runs: int) -> dict:
    """Records/s of file → feature sum at r = 1 for both maps, and the r = m naive baseline."""
    src = DataSource(path)
    freqs = draw_frequencies(FrequencySpec(d=src.d, m=m, scale=1.0))
    out = {}
    for feature in ("complex", "quantized"):
        t = median_time(lambda f=feature: feature_sum(src.chunks(), freqs, f, 1), runs)
        out[f"{feature}_r1_rps"] = src.n / t
    head = DataSource(path, rows=1 << 14)
    n_naive = 1 << 18

    def naive() -> None:
        def first():
            done = 0
            for c in head.chunks():
                yield c
                done += c.shape[0]
                if done >= n_naive:
                    return
        feature_sum(first(), freqs, "complex")

    out["naive_rm_rps"] = n_naive / median_time(naive, max(1, runs // 2))
    return out


def peak_rss(path: Path, m: int) -> dict:
    """Peak RSS (MB) of the ``fedsketch sketch`` process on ``path``, by GNU time."""
    exe = str(Path(sys.executable).with_name("fedsketch"))
    sk = OUT / "rss.npz"
    res = subprocess.run(
        ["/usr/bin/time", "-f", "%M", exe, "sketch", str(path), "--m", str(m), "--r", "1",
         "--epsilon", "0.01", "--bounds", "-15:15", "--out", str(sk), "--quiet"],
        capture_output=True, text=True, check=True,
    )
    kb = int(res.stderr.strip().splitlines()[-1])
    return {"peak_rss_mb": kb / 1024, "file_mb": path.stat().st_size / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=10_000_000, help="records in the streamed file")
    ap.add_argument("--quick", action="store_true", help="n = 10^6, 3 runs")
    ap.add_argument("--trig-n", type=int, default=200_000,
                    help="records of the r = m comparison with numpy's trigonometry")
    ap.add_argument("--pycle-n", type=int, default=20_000,
                    help="records of the r = m comparison with pycle (pycle's speed: ~5,000/s)")
    ap.add_argument("--trig-only", action="store_true",
                    help="only the r = m comparisons (pycle, numpy's trigonometry, accuracy)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.runs = 1_000_000, 3
    m, d = 1000, 10
    p = vs_pycle(n=args.pycle_n, m=m, d=d, runs=args.runs)
    print(f"r = m = {m}, d = {d}: ours {p['ours_rps']:,.0f} rec/s, pycle {p['pycle_rps']:,.0f} "
          f"rec/s, ratio {p['ratio']:.1f}x (max |diff| between the two sketches "
          f"{p['max_abs_diff']:.1e})")
    load = os.getloadavg()
    t = vs_numpy_trig(n=args.trig_n, m=m, d=d, runs=args.runs)
    print(f"r = m = {m}, d = {d} on {t['workers']} threads ({cpu_name()}; load average before "
          f"{load[0]:.2f}, after {os.getloadavg()[0]:.2f}): ours {t['ours_rps']:,.0f} rec/s, "
          f"numpy float32 cos + sin alone {t['trig_rps']:,.0f} rec/s: ratio {t['ratio']:.2f} of "
          f"the trigonometry's throughput (the numpy-only path without the fused kernel: "
          f"{t['numpy_path_rps']:,.0f} rec/s, ratio {t['numpy_path_ratio']:.2f})")
    lo, mid, hi = t["round_ratios"]
    print(f"  ratio round by round: min {lo:.2f}, median {mid:.2f}, max {hi:.2f}; per-run rec/s: "
          f"{t['runs']}")
    acc = accuracy(n=5000, m=m, d=d)
    for name, a in acc.items():
        print(f"  |delta| vs float64 ({name}): median {a['median']:.2e}, p99 {a['p99']:.2e}, "
              f"max {a['max']:.2e} grid steps; integers differ {a['differ']:.2e}")
    if args.trig_only:
        return
    path = data_file(args.n, d, 10)
    s = streaming(path, m, args.runs)
    print(f"r = 1 from a {args.n:,} x {d} float32 .npy: complex {s['complex_r1_rps']:,.0f} rec/s, "
          f"quantized {s['quantized_r1_rps']:,.0f} rec/s; naive r = m: {s['naive_rm_rps']:,.0f} "
          f"rec/s (r = 1 is {s['complex_r1_rps'] / s['naive_rm_rps']:.0f}x)")
    r = peak_rss(path, m)
    print(f"peak RSS of `fedsketch sketch` on the {r['file_mb']:.0f} MB file: "
          f"{r['peak_rss_mb']:.0f} MB")
    print("\n| figure | fedsketch | peer | ratio |\n|---|---|---|---|")
    print(f"| sketch r = m = 1000, d = 10 (rec/s) | {p['ours_rps']:,.0f} | pycle "
          f"{p['pycle_rps']:,.0f} | {p['ratio']:.1f}x |")
    print(f"| sketch r = m = 1000, d = 10 (rec/s) | {t['ours_rps']:,.0f} | numpy float32 cos + sin "
          f"alone {t['trig_rps']:,.0f} | {t['ratio']:.2f} |")
    print(f"| the same, numpy-only path (no fused kernel) | {t['numpy_path_rps']:,.0f} | numpy "
          f"float32 cos + sin alone {t['trig_rps']:,.0f} | {t['numpy_path_ratio']:.2f} |")
    print(f"| sketch r = 1, complex, from file (rec/s) | {s['complex_r1_rps']:,.0f} | naive r = m "
          f"{s['naive_rm_rps']:,.0f} | {s['complex_r1_rps'] / s['naive_rm_rps']:.0f}x |")
    print(f"| sketch r = 1, quantized, from file (rec/s) | {s['quantized_r1_rps']:,.0f} | naive "
          f"r = m {s['naive_rm_rps']:,.0f} | {s['quantized_r1_rps'] / s['naive_rm_rps']:.0f}x |")
    print(f"| peak RSS, {args.n:,} x 10 file (MB) | {r['peak_rss_mb']:.0f} | file size "
          f"{r['file_mb']:.0f} | {r['peak_rss_mb'] / r['file_mb']:.2f} |")


if __name__ == "__main__":
    main()
