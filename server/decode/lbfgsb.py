"""L-BFGS-B driven directly through SciPy's reverse-communication routine (``setulb``).

``scipy.optimize.minimize(method="L-BFGS-B", jac=True)`` wraps each objective evaluation in its
``ScalarFunction`` bookkeeping (copies of x and of the gradient, caching, counters): about 40 µs
per evaluation on the benchmark machine, more than CL-OMPR's compiled objective itself costs
(RESULTS.md §20). :func:`minimize_box` runs the same loop as SciPy's ``_minimize_lbfgsb`` (the
same calls to ``setulb`` with the same arguments: maxcor 10, maxls 20, factr = ftol/ε, pgtol =
gtol; every variable bounded on both sides), stops on the same tests (convergence, an iteration
cap, an evaluation cap), and evaluates the objective into one gradient buffer it reuses. It
returns the same iterate as ``minimize`` for the same objective (tests/decode/test_lbfgsb.py
compares them bit for bit), so it follows SciPy's routine, not a re-implementation of it.

``setulb`` lives in SciPy's private ``scipy.optimize._lbfgsb``; SciPy is pinned (pyproject.toml)
and the test above fails if a new SciPy changes the routine's interface or behaviour.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: SciPy's defaults for L-BFGS-B: stored corrections, line-search steps, evaluations.
MAXCOR = 10
MAXLS = 20
MAXFUN = 15000
#: ``setulb``'s task codes (SciPy's ``status_messages``).
_FG, _NEW_X = 3, 1


def minimize_box(fun: Callable[[np.ndarray, np.ndarray], float], x0: np.ndarray, lb: np.ndarray,
                 ub: np.ndarray, ftol: float, gtol: float, maxiter: int) -> tuple[np.ndarray, int]:
    """Minimize f over the box [lb, ub] from x0 (clipped into it): (x, number of evaluations).

    ``fun(x, grad)`` returns f(x) and writes ∇f(x) into ``grad`` (float64, x's shape). ``ftol``,
    ``gtol`` and ``maxiter`` as in ``scipy.optimize.minimize``'s L-BFGS-B options: stop when
    (f_k − f_{k+1})/max(|f_k|, |f_{k+1}|, 1) ≤ ftol, when the projected gradient's largest entry
    is ≤ gtol, or after ``maxiter`` iterations (or MAXFUN evaluations).
    """
    from scipy.optimize import _lbfgsb  # here, not at the top: see clompr's module docstring

    n = x0.size
    x = np.clip(np.asarray(x0, dtype=np.float64), lb, ub)
    lb, ub = np.asarray(lb, dtype=np.float64), np.asarray(ub, dtype=np.float64)
    nbd = np.full(n, 2, dtype=np.int32)  # both bounds finite
    grad = np.zeros(n)
    f = 0.0
    wa = np.zeros(2 * MAXCOR * n + 5 * n + 11 * MAXCOR * MAXCOR + 8 * MAXCOR)
    iwa = np.zeros(3 * n, dtype=np.int32)
    task, ln_task = np.zeros(2, dtype=np.int32), np.zeros(2, dtype=np.int32)
    lsave, isave = np.zeros(4, dtype=np.int32), np.zeros(44, dtype=np.int32)
    dsave = np.zeros(29)
    factr = ftol / np.finfo(float).eps
    iterations = evaluations = 0
    while True:
        _lbfgsb.setulb(MAXCOR, x, lb, ub, nbd, f, grad, factr, gtol, wa, iwa, task, lsave,
                       isave, dsave, MAXLS, ln_task)
        if task[0] == _FG:
            f = float(fun(x, grad))
            evaluations += 1
        elif task[0] == _NEW_X:
            iterations += 1
            if iterations >= maxiter or evaluations > MAXFUN:
                break
        else:
            break
    return x, evaluations
