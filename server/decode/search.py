"""CL-OMPR's step 1: screen fresh candidates by their correlation with the residual, then climb
the correlation from the best few of them by a Newton ascent (no scipy, no Python loop over
starts, steps or frequencies: compiled loops of :mod:`fedsketch.server.decode.kernels`).

All quantities are in the decoder's unit frame (:class:`fedsketch.server.decode.clompr.Frame`):
centroids u (dimensionless; Ω_u has entries of rms 1, so a correlation peak is about 1 wide),
residual res ∈ R^{2m} (real parts, imaginary parts; sketch units). With θ = Ω_uᵀc + ξ_u,

    g(c) = Re⟨u(c), res⟩ = (1/√m) Σ_j (cos θ_j Re res_j + sin θ_j Im res_j),
    ∇g(c) = (1/√m) Σ_j ω_j (cos θ_j Im res_j − sin θ_j Re res_j),
    ∇²g(c) = −(1/√m) Σ_j ω_j ω_jᵀ (cos θ_j Re res_j + sin θ_j Im res_j)

(sketch units, per unit-frame length, per unit-frame length²), all three from one pass over the
m frequencies that computes each cos θ_j and sin θ_j once.

Each call draws CANDIDATES points uniform in the box ("Range" starts, never data) and keeps the
``starts`` of largest g. :meth:`AtomSearch.ascend` then climbs from each of them: a Newton
step on |∇²g| (eigenvalues by magnitude, floored at EIG_FLOOR of the largest, so that saddles and
valleys are climbed out of rather than into; where −∇²g is positive definite with every eigenvalue
above the floor, the same step by Cholesky), at most TRUST long, clipped to the box and halved
until g rises; a start's ascent ends when it moves by less than XTOL. Lengths are unit-frame
lengths (the width of a peak), the floor is relative to ∇²g's own scale and the acceptance test
compares g with itself: nothing depends on the data's units or the sketch's magnitude.

The screening runs in float32 (a ranking only: phases, Cephes' polynomials and sums in float32,
vectorized over the candidates); the ascent in float64 (cos and sin within 2.3·10⁻¹⁶ of NumPy's).
Step 1 only proposes a start: step 5 refines every centroid jointly.
"""

from __future__ import annotations

import numpy as np

#: Uniform candidates screened per call (the best ``starts`` of them are climbed from); as many
#: as the L-BFGS-B step 1 it replaced screened.
CANDIDATES = 512
#: Newton steps of one ascent, at most.
MAX_STEPS = 12
#: Longest Newton step (unit-frame lengths: the width of a correlation peak).
TRUST = 1.0
#: The ascent ends when no start moves by this much (unit-frame lengths).
XTOL = 1e-3
#: |eigenvalues| of ∇²g are floored at this fraction of the largest one.
EIG_FLOOR = 1e-3
#: Halvings of a step that does not raise g before its start stays where it is for this step.
HALVINGS = 6


def _kernels():
    """:mod:`fedsketch.server.decode.kernels`, imported on first use (numba loads only then)."""
    from fedsketch.server.decode import kernels

    return kernels


class AtomSearch:
    """Step 1 for one decoding: Ω_u (d, m), ξ_u (m,), the box [lo, hi] (unit frame) and the
    generator of the candidates."""

    def __init__(self, omega: np.ndarray, xi: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 rng: np.random.Generator) -> None:
        self.omega = np.ascontiguousarray(omega, dtype=np.float64)
        self.xi = np.ascontiguousarray(xi, dtype=np.float64)
        self.lo, self.hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
        self.rng = rng
        self.omega32, self.xi32 = self.omega.astype(np.float32), self.xi.astype(np.float32)

    def __call__(self, res: np.ndarray, starts: int) -> np.ndarray:
        """The atom (d,) of largest g after climbing from the ``starts`` best of CANDIDATES fresh
        uniform candidates against ``res`` (2m,)."""
        x, g = self._ascend(self.screen(res, starts), res)
        return x[int(np.argmax(g))]

    def screen(self, res: np.ndarray, starts: int) -> np.ndarray:
        """The ``starts`` (starts, d) of max(CANDIDATES, starts) fresh uniform candidates with the
        largest g against ``res``, best first (float32 phases and sums: a ranking only)."""
        m = self.xi.size
        cands = self.rng.uniform(self.lo, self.hi, size=(max(CANDIDATES, starts), self.lo.size))
        r = res.astype(np.float32)
        g = _kernels().screen(np.ascontiguousarray(cands.T, dtype=np.float32), self.omega32,
                              self.xi32, r[:m], r[m:])
        return cands[np.argsort(g)[::-1][:starts]]

    def correlation(self, points: np.ndarray, res: np.ndarray, order: int = 0) -> tuple[np.ndarray, ...]:
        """g (L,) at ``points`` (L, d); with ``order`` 2 also ∇g (L, d) and ∇²g (L, d, d)."""
        m = self.xi.size
        res = np.asarray(res, dtype=np.float64)
        g, grad, neg_hess = _kernels().correlation(
            np.ascontiguousarray(points, dtype=np.float64), self.omega, self.xi,
            np.ascontiguousarray(res[:m]), np.ascontiguousarray(res[m:]), order)
        return (g,) if order == 0 else (g, grad, -neg_hess)

    def ascend(self, starts: np.ndarray, res: np.ndarray) -> np.ndarray:
        """Local maxima of g in the box from each row of ``starts`` (L, d) (L, d).

        Module docstring: Newton on |∇²g| with a floor, a trust length, clipping to the box, and
        halving until g rises; a row stops when its step is shorter than XTOL or no halving
        raises g, or after MAX_STEPS steps.
        """
        return self._ascend(starts, res)[0]

    def _ascend(self, starts: np.ndarray, res: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`ascend`'s maxima (L, d) and g there (L,)."""
        m = self.xi.size
        res = np.asarray(res, dtype=np.float64)
        return _kernels().ascend(np.ascontiguousarray(starts, dtype=np.float64), self.omega,
                                 self.xi, np.ascontiguousarray(res[:m]),
                                 np.ascontiguousarray(res[m:]), self.lo, self.hi, MAX_STEPS,
                                 TRUST, XTOL, EIG_FLOOR, HALVINGS)
