"""The public grid of the centralized mechanisms' integer releases (common/dp/grid.py) and the
limits of the exact samplers' wrappers (common/dp/samplers.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.common.dp import grid
from fedsketch.common.dp.samplers import MAX_SCALE, dgauss_noise, dlap_noise
from fedsketch.server.bench.task import Task


def test_encode_clips_to_the_bound_and_refuses_what_is_not_finite():
    g = grid.step(2.0)
    assert g == 2.0 / 2**20
    q = grid.encode(np.array([2.0, -2.0, 1e300, -7.0, 1.0, 0.4 * g, 0.6 * g]), g)
    assert q.tolist() == [2**20, -(2**20), 2**20, -(2**20), 2**19, 0, 1]
    assert q.dtype == np.int64
    for bad in (np.nan, np.inf, -np.inf):
        for limit in (grid.STEPS, None):
            with pytest.raises(ValueError, match="not finite"):
                grid.encode(np.array([0.5, bad]), g, limit=limit)


def test_unbounded_encode_refuses_beyond_its_range():
    assert grid.encode(np.array([float(grid.MAX_STEPS)]), 1.0, limit=None).tolist() == [grid.MAX_STEPS]
    with pytest.raises(ValueError, match="too large against its sensitivity"):
        grid.encode(np.array([2.0 * grid.MAX_STEPS]), 1.0, limit=None)
    with pytest.raises(ValueError, match="finite and > 0"):
        grid.step(0.0)
    with pytest.raises(ValueError, match="at most"):
        grid.check_rows(grid.MAX_ROWS + 1)
    grid.check_rows(grid.MAX_ROWS)


def test_outer_sum_encodes_each_record_on_its_own_across_blocks():
    """d = 64: blocks of 2^22/64² = 1024 rows, so 3000 rows take three; the sum is of per-record
    roundings (not the rounding of the sum)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    g = grid.step(1.0)
    expected = np.zeros((64, 64), dtype=np.int64)
    for row in x:
        expected += np.rint(np.outer(row, row) / g).astype(np.int64)
    np.testing.assert_array_equal(grid.outer_sum(x, g), expected)
    assert not np.array_equal(expected, np.rint(x.T @ x / g))


def test_l2_in_steps_counts_the_rounding_and_the_float_margin():
    g = 2.0**-20
    expected = (math.sqrt(2) * 2**20 + math.sqrt(55)) * (1 + 2**-20)
    assert grid.l2_in_steps(math.sqrt(2), g, 55, True) == expected
    assert grid.l2_in_steps(1.0, g, 100, False) == (2**20 + 5.0) * (1 + 2**-20)


def test_samplers_refuse_scales_beyond_the_int64_range():
    with pytest.raises(ValueError, match="too small for an integer release"):
        dlap_noise(1e-10, 2.0**20, 3)
    with pytest.raises(ValueError, match="too small for an integer release"):
        dgauss_noise(2.0 * MAX_SCALE, 3)
    assert dlap_noise(1.0, MAX_SCALE, 2).shape == (2,)


def test_tasks_refuse_records_that_are_not_finite():
    x = np.zeros((5, 2))
    x[3, 1] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        Task(x, 2, 1.0)
    x[3, 1] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        Task(x, 2, 1.0)
