"""L-BFGS-B through SciPy's routine without ``minimize``'s wrapper (server/decode/lbfgsb.py):
the same iterate as ``scipy.optimize.minimize`` on CL-OMPR's step-5 problem, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import Bounds, minimize

from fedsketch.common.sketch.frequencies import FrequencySpec, draw_frequencies
from fedsketch.server.decode import clompr as C
from fedsketch.server.decode.lbfgsb import minimize_box


@pytest.mark.parametrize(("ftol", "maxiter"), [(1e-6, 300), (1e-12, 3000), (1e-12, 4)])
def test_same_iterate_as_scipy_minimize(ftol, maxiter):
    freqs = draw_frequencies(FrequencySpec(d=3, m=80, scale=1.0, seed=4))
    rng = np.random.default_rng(0)
    sketch = rng.normal(size=160) / 10
    k = 3
    x0 = np.concatenate([rng.uniform(-2, 2, size=3 * k), rng.uniform(0.1, 1, size=k)])
    lb = np.concatenate([np.full(3 * k, -3.0), np.full(k, 1e-9)])
    ub = np.concatenate([np.full(3 * k, 3.0), np.full(k, 2.0)])
    gain = 1 / math.sqrt(80)

    def fun(x, grad):
        value, g = C._step5_objective(x, freqs.omega, freqs.xi, sketch, gain)
        grad[:] = g
        return value

    ours, evaluations = minimize_box(fun, x0, lb, ub, ftol, 1e-5, maxiter)
    theirs = minimize(C._step5_objective, x0, args=(freqs.omega, freqs.xi, sketch, gain),
                      method="L-BFGS-B", jac=True, bounds=Bounds(lb, ub),
                      options={"ftol": ftol, "gtol": 1e-5, "maxiter": maxiter})
    assert np.array_equal(ours, theirs.x)
    assert evaluations == theirs.nfev
    assert evaluations > 3  # it iterated
