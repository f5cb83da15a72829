"""`make demo`: federated and single-curator private compressive k-means, in under a minute.

1. ``fedsketch simulate``: a real coordinator and 20 real devices over TLS on loopback share
   10^6 synthetic records; each device spends ε = 1 on one private sketch; the coordinator
   averages and decodes.
2. The single-curator command-line pipeline as real processes (synth → sketch with a private
   ``--scale auto`` → decode → evaluate).
3. A table of relative SSE against scikit-learn k-means for several budgets ε and both feature
   maps, all from one dataset held by one curator.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from fedsketch.common.data.dataio import load_all
from fedsketch.common.features import FIRST_HARMONIC
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.privacy import PrivacySpec, privatize
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.server.bench.metrics import RELATIVE_SSE_MEANING, sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.decode.clompr import clompr

N, K, D, M = 1_000_000, 10, 10, 1000
SIGMA = 2.0  # σ in data units (benchmarks/RESULTS.md: the oracle grid picks 2 on this data)
BOUND = 15.0  # public box [−15, 15]^10: centres have sd 2.5·10^0.1 ≈ 3.1, records add N(0, I)
console = Console()


def cli(*args: str) -> str:
    """Run ``fedsketch ARGS`` as a process, echo the command, return its stdout."""
    exe = str(Path(sys.executable).with_name("fedsketch"))
    console.print(f"[bold]$ fedsketch {' '.join(args)}[/bold]")
    res = subprocess.run([exe, *args], capture_output=True, text=True)
    if res.returncode != 0:
        console.print(res.stderr)
        raise SystemExit(res.returncode)
    return res.stdout


def main() -> None:
    t0 = time.perf_counter()
    print(cli("simulate", "--devices", "20", "--records", str(N), "--epsilon", "1"))
    with tempfile.TemporaryDirectory() as tmp:
        x_path, s_path, c_path = (Path(tmp) / f for f in ("X.npy", "S.npz", "C.json"))
        cli("synth", "gmm", "--n", str(N), "--k", str(K), "--d", str(D), "--separation", "2.5",
            "--seed", "0", "--out", str(x_path), "--quiet")
        cli("sketch", str(x_path), "--m", str(M), "--r", "1", "--epsilon", "0.1",
            "--out", str(s_path), "--quiet")
        c_path.write_text(cli("decode", str(s_path), "--k", str(K), "--bounds",
                              f"-{BOUND}:{BOUND}", "--replicates", "3", "--json", "--quiet"))
        ev = json.loads(cli("evaluate", "--data", str(x_path), "--centroids", str(c_path),
                            "--json"))
        console.print(f"relative SSE at ε = 0.1 (replace-one, n public): "
                      f"[bold]{ev['relative_sse']:.3f}[/bold]\n")
        x = load_all(x_path)

    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, K))
    lo, hi = np.full(D, -BOUND), np.full(D, BOUND)
    freqs = draw_frequencies(FrequencySpec(d=D, m=M, scale=SIGMA))
    table = Table(title=f"CKM on {N:,} records, k = d = {K}, m = {M}, r = 1 "
                        f"(relative SSE vs k-means, n_init = 3)")
    for col in ("feature", "ε", "relative SSE", "sketch s", "decode s"):
        table.add_column(col, justify="right")
    for feature in ("complex", "quantized"):
        t = time.perf_counter()
        fs = feature_sum(split(x), freqs, feature, 1)
        t_sketch = time.perf_counter() - t
        for eps in (float("inf"), 1.0, 0.1, 0.03):
            release = privatize(fs, PrivacySpec(eps))
            t = time.perf_counter()
            res = clompr(release.sketch, freqs.omega, freqs.xi, K, lo, hi,
                         harmonic=FIRST_HARMONIC[feature], replicates=3,
                         rng=np.random.default_rng(0))
            t_dec = time.perf_counter() - t
            rel = sse_per_n(split(x), res.centroids) / ref
            table.add_row(feature, "∞" if eps == float("inf") else f"{eps:g}", f"{rel:.3f}",
                          f"{t_sketch:.2f}", f"{t_dec:.2f}")
    console.print(table)
    console.print(RELATIVE_SSE_MEANING, soft_wrap=True)
    console.print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
