"""diffprivlib's KMeans on one dataset, run in a venv of its own (bench_realdata.py makes it).

diffprivlib 0.6.6 imports ``sklearn.tree._tree.DOUBLE``, which scikit-learn 1.9 (this project's
bench pin) no longer has, so it runs beside scikit-learn 1.5.2 in ``benchmarks/out/diffprivlib-venv``
and talks to the bench through files: it reads the records (.npy), fits at every ε and seed
given, and writes JSON {"eps/seed": {"centroids": [[...]], "seconds": s}}.

Usage: python diffprivlib_kmeans.py X.npy K BOX EPS[,EPS...] SEEDS OUT.json
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
from diffprivlib.models import KMeans


def main(path: str, k: str, box: str, epsilons: str, seeds: str, out: str) -> None:
    x = np.load(path)
    d = x.shape[1]
    bounds = (np.full(d, -float(box)), np.full(d, float(box)))
    results = {}
    for eps in (float(e) for e in epsilons.split(",")):
        for seed in range(int(seeds)):
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = KMeans(n_clusters=int(k), epsilon=eps, bounds=bounds, random_state=seed).fit(x)
            results[f"{eps:g}/{seed}"] = {"centroids": model.cluster_centers_.tolist(),
                                          "seconds": time.perf_counter() - t}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
