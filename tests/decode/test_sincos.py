"""The shared-reduction float64 sine and cosine of step 5 against NumPy's."""

from __future__ import annotations

import numpy as np
import pytest

from fedsketch.server.decode.sincos import sincos


@pytest.mark.parametrize("bound", [1e-3, 1.0, 30.0, 1e4])
def test_agrees_with_numpy_to_the_rounding_of_theta(bound):
    theta = np.random.default_rng(0).uniform(-bound, bound, size=200_000)
    cos, sin = sincos(theta)
    # module docstring: a few 10⁻¹⁶ · max(1, |θ|) (measured ≤ 7·10⁻¹⁶ at |θ| ≤ 1, 1.3·10⁻¹⁶·|θ|
    # beyond); 2·10⁻¹⁵ leaves room, and dropping the smallest kept term (r⁶/6!, 5·10⁻¹⁵ at the
    # edge of the table's interval) exceeds it.
    tol = 2e-15 * max(1.0, bound)
    assert np.abs(cos - np.cos(theta)).max() <= tol
    assert np.abs(sin - np.sin(theta)).max() <= tol


def test_keeps_shape_and_exact_points():
    theta = np.array([[0.0, np.pi / 2], [-np.pi, 2 * np.pi]])
    cos, sin = sincos(theta)
    assert cos.shape == sin.shape == (2, 2)
    np.testing.assert_allclose(cos, [[1, 0], [-1, 1]], atol=1e-15)
    np.testing.assert_allclose(sin, [[0, 1], [0, 0]], atol=1e-15)
