"""CL-OMPR's step 1 (server/decode/search.py, compiled in server/decode/kernels.py): the
correlation's derivatives, and the Newton ascent finding a known peak inside the box and
stopping on its edge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.server.decode import clompr as C
from fedsketch.server.decode import search as S


def _unit_problem(d: int, m: int, seed: int):
    """Ω_u, ξ_u in the unit frame of the box [−3, 3]^d, and the box."""
    freqs = draw_frequencies(FrequencySpec(d=d, m=m, scale=1.0, seed=seed))
    lo, hi = np.full(d, -3.0), np.full(d, 3.0)
    frame = C.Frame.of(freqs.omega, lo, hi)
    omega, xi = frame.frequencies(freqs.omega, freqs.xi)
    return omega, xi, frame.to_unit(lo), frame.to_unit(hi)


def _atom(c: np.ndarray, omega: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """The unit atom u(c) as (2m,): its correlation with itself is 1, the maximum of g."""
    return C.stacked_atoms(c[None, :], omega, xi, 1.0 / math.sqrt(xi.size))[:, 0]


def test_gradient_and_hessian_match_the_float64_correlation():
    omega, xi, lo, hi = _unit_problem(4, 300, seed=1)
    rng = np.random.default_rng(2)
    res = rng.normal(size=600) / 20
    search = S.AtomSearch(omega, xi, lo, hi, rng)
    x = rng.uniform(-1, 1, size=(5, 4))
    g, grad, hess = search.correlation(x, res, 2)
    g64, grad64 = C._correlations(x, omega, xi, res)  # float64, checked against differences
    scale = np.abs(res).sum() / math.sqrt(300)  # bound on |g| (sketch units)
    np.testing.assert_allclose(g, g64, atol=1e-6 * scale)
    np.testing.assert_allclose(grad, grad64, atol=1e-6 * scale * np.abs(omega).max())
    h = 1e-5
    fd = np.stack([(C._correlations(x + h * e, omega, xi, res)[1]
                    - C._correlations(x - h * e, omega, xi, res)[1]) / (2 * h)
                   for e in np.eye(4)], axis=2)  # fd[l, a, b] = ∂(∇g)_a / ∂x_b
    np.testing.assert_allclose(hess, fd, atol=1e-5 * scale * np.abs(omega).max() ** 2)
    np.testing.assert_allclose(hess, hess.transpose(0, 2, 1), atol=1e-12)


def test_ascent_climbs_to_a_known_peak_from_every_nearby_start():
    omega, xi, lo, hi = _unit_problem(3, 200, seed=4)
    peak = np.array([0.3, -0.2, 0.1])
    res = _atom(peak, omega, xi)
    rng = np.random.default_rng(5)
    starts = peak + rng.uniform(-0.3, 0.3, size=(6, 3))  # a peak is about 1 wide (unit frame)
    search = S.AtomSearch(omega, xi, lo, hi, rng)
    x = search.ascend(starts, res)
    assert np.abs(x - peak).max() < 5 * S.XTOL
    g0, = search.correlation(starts, res)
    g1, = search.correlation(x, res)
    assert np.all(g1 >= g0) and g1.min() > 0.999  # g(peak) = 1


def test_search_finds_the_peak_from_uniform_candidates_and_keeps_to_the_box():
    omega, xi, lo, hi = _unit_problem(2, 150, seed=6)
    peak = lo + 0.3 * (hi - lo)
    search = S.AtomSearch(omega, xi, lo, hi, np.random.default_rng(7))
    assert np.abs(search(_atom(peak, omega, xi), 3) - peak).max() < 5 * S.XTOL
    outside = hi + 0.2 * (hi - lo)  # the best atom in the box is then on its edge
    found = search(_atom(outside, omega, xi), 3)
    assert np.all(found >= lo) and np.all(found <= hi)
    assert np.isclose(found, hi).any()


@pytest.mark.parametrize("steps", [1, 2, S.MAX_STEPS])
def test_ascent_never_lowers_the_correlation(monkeypatch, steps):
    monkeypatch.setattr(S, "MAX_STEPS", steps)  # one step at a time: each must be accepted on merit
    omega, xi, lo, hi = _unit_problem(3, 200, seed=8)
    rng = np.random.default_rng(9)
    centres = rng.uniform(lo, hi, (3, 3))
    res = sum(w * _atom(c, omega, xi) for w, c in zip([0.5, 0.3, 0.2], centres, strict=True))
    search = S.AtomSearch(omega, xi, lo, hi, rng)
    starts = rng.uniform(lo, hi, size=(200, 3))
    g0, = search.correlation(starts, res)
    g1, = search.correlation(search.ascend(starts, res), res)
    assert np.all(g1 >= g0)
