"""Sketching speed and memory, against pycle 1.2 measured in the same run.

1. r = m, m = 1000, d = 10: records/s of ``feature_sum`` vs pycle's ``computeSketch`` on the same
   in-memory data and the same Ω (pycle uses float64 complex exponentials).
2. r = 1 (``complex`` and ``quantized``): records/s streaming a 10^7 × 10 float32 ``.npy`` file,
   file reading included, against the naive baseline of computing all m entries (r = m) per record.
3. Peak RSS of ``fedsketch sketch`` on that file (GNU time ``%M``), against the file's size.

Each figure is the median of ``--runs`` runs. Usage: python benchmarks/bench_sketch.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

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
         "--epsilon", "0.01", "--out", str(sk), "--quiet"],
        capture_output=True, text=True, check=True,
    )
    kb = int(res.stderr.strip().splitlines()[-1])
    return {"peak_rss_mb": kb / 1024, "file_mb": path.stat().st_size / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=10_000_000, help="records in the streamed file")
    ap.add_argument("--quick", action="store_true", help="n = 10^6, 3 runs")
    args = ap.parse_args()
    if args.quick:
        args.n, args.runs = 1_000_000, 3
    m, d = 1000, 10
    p = vs_pycle(n=20_000, m=m, d=d, runs=args.runs)
    print(f"r = m = {m}, d = {d}: ours {p['ours_rps']:,.0f} rec/s, pycle {p['pycle_rps']:,.0f} "
          f"rec/s, ratio {p['ratio']:.1f}x (max |diff| between the two sketches "
          f"{p['max_abs_diff']:.1e})")
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
    print(f"| sketch r = 1, complex, from file (rec/s) | {s['complex_r1_rps']:,.0f} | naive r = m "
          f"{s['naive_rm_rps']:,.0f} | {s['complex_r1_rps'] / s['naive_rm_rps']:.0f}x |")
    print(f"| sketch r = 1, quantized, from file (rec/s) | {s['quantized_r1_rps']:,.0f} | naive "
          f"r = m {s['naive_rm_rps']:,.0f} | {s['quantized_r1_rps'] / s['naive_rm_rps']:.0f}x |")
    print(f"| peak RSS, {args.n:,} x 10 file (MB) | {r['peak_rss_mb']:.0f} | file size "
          f"{r['file_mb']:.0f} | {r['peak_rss_mb'] / r['file_mb']:.2f} |")


if __name__ == "__main__":
    main()
