"""The fused r = m ``complex`` kernel (common/sketch/trig_kernel.py): the compiled loop is its
numpy specification bit for bit, the integers do not depend on threads or chunking, the slow path
takes large phases, and sin/cos stay within a few float32 ulp of float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.common.features import GRID
from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.common.sketch.sketching import feature_sum
from fedsketch.common.sketch.trig_kernel import FAST_LIMIT, FLUSH_ROWS, FusedComplex


def _data(d: int, m: int, n: int, seed: int):
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=1.0, seed=seed))
    x = np.random.default_rng(seed).normal(0, 3, (n, d)).astype(np.float32)
    return freqs, x


@pytest.mark.parametrize("d", [1, 3, 40])
def test_compiled_loop_is_its_specification_bit_for_bit(d):
    """m = 37: the vector loop and its scalar remainder both run. Record by record on a grid of
    2^20 steps (nothing cancels, and a change in the last bits of a phase shows), then the sums
    on the grid of 1024."""
    freqs, x = _data(d, 37, 400, seed=d)
    fine = FusedComplex(freqs.omega, freqs.xi, 2**20)
    c, s = fine.reference(x)
    for i in range(0, x.shape[0], 3):
        re, im = np.zeros(37), np.zeros(37)
        fine.add_rows(x[i:i + 1], re, im)
        np.testing.assert_array_equal(re, c[i])
        np.testing.assert_array_equal(im, s[i])
    fused = FusedComplex(freqs.omega, freqs.xi, GRID["complex"])
    c, s = fused.reference(x)
    re, im = np.zeros(37), np.zeros(37)
    fused.add_rows(x, re, im)
    np.testing.assert_array_equal(re, c.sum(axis=0, dtype=np.float64))
    np.testing.assert_array_equal(im, s.sum(axis=0, dtype=np.float64))


def test_sums_of_more_than_flush_rows_are_exact():
    """40,000 records in one call, each encoding entry 0 to the odd 1023: the float32 run sums
    must move to float64 before 2^24 (FLUSH_ROWS·γ ≤ 2^23), or odd steps are lost."""
    assert FLUSH_ROWS * GRID["complex"] <= 2**23
    omega = np.array([[0.5, 1.0]])
    fused = FusedComplex(omega, np.zeros(2), GRID["complex"])
    x = np.full((40_000, 1), 0.08, dtype=np.float32)  # phase 0.04 rad: round(1024 cos) = 1023
    re, im = np.zeros(2), np.zeros(2)
    fused.add_rows(x, re, im)
    assert re[0] == 1023 * 40_000


def test_integers_do_not_depend_on_threads_or_chunks():
    """1 thread against 2, one chunk against chunks of 97 and of 1000 rows: the same integers."""
    freqs, x = _data(10, 300, 6000, seed=1)
    one = feature_sum([x], freqs, "complex", workers=1)
    for chunks, workers in (([x], 2), ([x[i:i + 97] for i in range(0, len(x), 97)], 2),
                            ([x[i:i + 1000] for i in range(0, len(x), 1000)], 1)):
        other = feature_sum(chunks, freqs, "complex", workers=workers)
        np.testing.assert_array_equal(other.re, one.re)
        np.testing.assert_array_equal(other.im, one.im)
    assert one.n == 6000 and np.abs(one.re).max() > 0


def test_large_phases_take_the_float64_path():
    """A record whose phase bound reaches FAST_LIMIT is encoded from float64 cos and sin of its
    float32 phase (the fast range reduction is exact only below 8192 rad); NaN is refused."""
    freqs, _ = _data(2, 16, 1, seed=2)
    fused = FusedComplex(freqs.omega, freqs.xi, GRID["complex"])
    x = np.array([[3e6, -2e6], [1.0, 2.0]], dtype=np.float32)
    assert float(np.abs(x[0]) @ fused.bound[:2] + fused.bound[2]) >= FAST_LIMIT
    re, im = np.zeros(16), np.zeros(16)
    fused.add_rows(x[:1], re, im)
    p0 = (x[0, 0] * fused.omega[0]).astype(np.float64)  # float32 product, then fma (a·b exact
    t = (np.float64(x[0, 1]) * fused.omega[1].astype(np.float64) + p0).astype(np.float32)  # in f64)
    t = ((t + fused.xi) + fused.xlo).astype(np.float64)
    np.testing.assert_array_equal(re, np.rint(1024 * np.cos(t)))
    np.testing.assert_array_equal(im, np.rint(1024 * np.sin(t)))
    with pytest.raises(ValueError, match="not finite"):
        feature_sum([np.array([[np.nan, 0.0]], dtype=np.float32)], freqs, "complex")


def test_sin_and_cos_within_a_few_ulp_of_float64():
    """On a grid of 2^20 steps (so that rounding hides nothing) over phases in ±8000 rad, the
    kernel's cos and sin of a float32 phase t differ from float64's cos t and sin t by at most
    2^-21 (four float32 ulp of 1) plus the half step of the rounding; measured ≈ 1.4·2^-24."""
    t = np.random.default_rng(3).uniform(-8000, 8000, 200_000).astype(np.float32)
    gamma = 2.0**20
    fused = FusedComplex(np.ones((1, 1)), np.zeros(1), int(gamma))
    c, s = fused.reference(t[:, None])
    for got, exact in ((c[:, 0], np.cos(t.astype(np.float64))), (s[:, 0], np.sin(t.astype(np.float64)))):
        err = np.abs(got.astype(np.float64) - gamma * exact)
        assert err.max() <= gamma * 2.0**-21 + 0.5, err.max()
    assert math.isclose(float(np.abs(c[:, 0]).max()), gamma, rel_tol=1e-6)


def test_the_fused_loop_is_chosen_by_m_alone_and_agrees_with_numpy():
    """From FUSED_MIN_M on (a public number of the spec) the r = m complex sketch takes the fused
    loop, below it numpy, whatever the data, chunks or threads; the two float32 paths round a few
    phases differently (about 1.5·10⁻⁴ of the integers each against float64, RESULTS.md §21), so
    their sums over 2,000 records differ by a few grid steps, never by a record's worth (1024)."""
    from fedsketch.common.sketch.sketching import FUSED_MIN_M, _Kernel

    assert _Kernel(draw_frequencies(FrequencySpec(d=3, m=FUSED_MIN_M - 1, scale=1.0)),
                   "complex", FUSED_MIN_M - 1).fused is None
    freqs, x = _data(3, FUSED_MIN_M, 2000, seed=2)
    assert _Kernel(freqs, "complex", FUSED_MIN_M).fused is not None
    assert _Kernel(freqs, "complex", 1).fused is None
    assert _Kernel(freqs, "quantized", FUSED_MIN_M).fused is None
    fused = feature_sum([x], freqs, "complex")
    kernel = _Kernel(freqs, "complex", FUSED_MIN_M)
    kernel.fused = None  # the numpy path of the same spec
    numpy_re, numpy_im = kernel.chunk_sum(x, None)
    diff = np.abs(np.concatenate([fused.re - numpy_re, fused.im - numpy_im]))
    assert diff.max() <= 8, diff.max()
