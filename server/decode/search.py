"""CL-OMPR's step 1: screen fresh candidates by their correlation with the residual, then climb
the correlation from the best few of them by a batched Newton ascent (no scipy, no Python loop
over starts).

All quantities are in the decoder's unit frame (:class:`fedsketch.server.decode.clompr.Frame`):
centroids u (dimensionless; Ω_u has entries of rms 1, so a correlation peak is about 1 wide),
residual res ∈ R^{2m} (real parts, imaginary parts; sketch units). With θ = Ω_uᵀc + ξ_u,

    g(c) = Re⟨u(c), res⟩ = (1/√m) Σ_j (cos θ_j Re res_j + sin θ_j Im res_j),
    ∇g(c) = (1/√m) Σ_j ω_j (cos θ_j Im res_j − sin θ_j Re res_j),
    ∇²g(c) = −(1/√m) Σ_j ω_j ω_jᵀ (cos θ_j Re res_j + sin θ_j Im res_j)

(sketch units, per unit-frame length, per unit-frame length²); ∇²g of L points is one
(L, m)·(m, d²) product with Ω's pairwise products ω_j ω_jᵀ, which :class:`AtomSearch` keeps.

Each call draws CANDIDATES points uniform in the box ("Range" starts, never data) and keeps the
``starts`` of largest g. :meth:`AtomSearch.ascend` then climbs from all of them at once: a Newton
step on |∇²g| (eigenvalues by magnitude, floored at EIG_FLOOR of the largest, so that saddles and
valleys are climbed out of rather than into), at most TRUST long, clipped to the box and halved
until g rises; the ascent ends when no start moves by XTOL. Lengths are unit-frame lengths (the
width of a peak), the floor is relative to ∇²g's own scale and the acceptance test compares g
with itself: nothing depends on the data's units or the sketch's magnitude.

Trigonometry runs in float32 (SIMD; measured about 20× faster than NumPy's float64 here), on
phases reduced to [−π, π] in float64 (the screening's phases stay within the box's phase bound
around ξ_u, so it computes them in float32 directly); sums run in float64. Step 1 only proposes a
start: step 5 refines every centroid jointly in float64.
"""

from __future__ import annotations

import math

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
#: Ω's pairwise products are kept when they take at most this many float64s (16 MB); past it
#: ∇²g is computed as L products (d, m)·(m, d) instead (same flops, a worse shape for BLAS).
PAIRS_MAX = 1 << 21
#: Halvings of a step that does not raise g before its start stays where it is for this step.
HALVINGS = 6


def unit_phases(points: np.ndarray, omega: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """θ = Ω_uᵀc + ξ_u for ``points`` (L, d), reduced to [−π, π] in float64, as float32 (L, m)."""
    theta = points @ omega + xi
    theta -= (2.0 * math.pi) * np.rint(theta * (1.0 / (2.0 * math.pi)))
    return theta.astype(np.float32)


class AtomSearch:
    """Step 1 for one decoding: Ω_u (d, m), ξ_u (m,), the box [lo, hi] (unit frame), the generator
    of the candidates, and Ω's pairwise products (m, d²) for ∇²g."""

    def __init__(self, omega: np.ndarray, xi: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 rng: np.random.Generator) -> None:
        self.omega, self.xi, self.lo, self.hi, self.rng = omega, xi, lo, hi, rng
        self.omega32, self.xi32 = omega.astype(np.float32), xi.astype(np.float32)
        d, m = omega.shape
        self.pairs = ((omega[:, None, :] * omega[None, :, :]).reshape(d * d, m).T.copy()
                      if d * d * m <= PAIRS_MAX else None)

    def __call__(self, res: np.ndarray, starts: int) -> np.ndarray:
        """The atom (d,) of largest g after climbing from the ``starts`` best of CANDIDATES fresh
        uniform candidates against ``res`` (2m,)."""
        x = self.ascend(self.screen(res, starts), res)
        (g,) = self.correlation(x, res)
        return x[int(np.argmax(g))]

    def screen(self, res: np.ndarray, starts: int) -> np.ndarray:
        """The ``starts`` (starts, d) of max(CANDIDATES, starts) fresh uniform candidates with the
        largest g against ``res``, best first (float32 phases and sums: a ranking only)."""
        m = self.xi.size
        cands = self.rng.uniform(self.lo, self.hi, size=(max(CANDIDATES, starts), self.lo.size))
        theta = cands.astype(np.float32) @ self.omega32 + self.xi32
        r = res.astype(np.float32)
        g = np.cos(theta) @ r[:m] + np.sin(theta) @ r[m:]
        return cands[np.argsort(g)[::-1][:starts]]

    def correlation(self, points: np.ndarray, res: np.ndarray, order: int = 0) -> tuple[np.ndarray, ...]:
        """g (L,) at ``points`` (L, d); with ``order`` 2 also ∇g (L, d) and ∇²g (L, d, d)."""
        m = self.xi.size
        theta = unit_phases(points, self.omega, self.xi)
        cos, sin = np.cos(theta).astype(np.float64), np.sin(theta).astype(np.float64)
        re, im = res[:m], res[m:]
        scale = 1.0 / math.sqrt(m)
        w = (cos * re + sin * im) * scale  # (L, m): each frequency's share of g
        g = w.sum(axis=1)
        if order == 0:
            return (g,)
        grad = ((cos * im - sin * re) @ self.omega.T) * scale
        if self.pairs is None:
            return g, grad, -np.matmul(self.omega[None, :, :] * w[:, None, :], self.omega.T)
        d = self.lo.size
        return g, grad, -(w @ self.pairs).reshape(-1, d, d)

    def ascend(self, starts: np.ndarray, res: np.ndarray) -> np.ndarray:
        """Local maxima of g in the box from each row of ``starts`` (L, d), all rows at once (L, d).

        Module docstring: Newton on |∇²g| with a floor, a trust length, clipping to the box, and
        halving until g rises; a row stops when its step is shorter than XTOL or no halving
        raises g, and the ascent when every row has stopped or after MAX_STEPS steps.
        """
        x = np.clip(starts, self.lo, self.hi)
        g = np.empty(x.shape[0])
        rows = np.arange(x.shape[0])
        for _ in range(MAX_STEPS):
            xr = x[rows]
            g[rows], grad, hess = self.correlation(xr, res, 2)
            vals, vecs = np.linalg.eigh(-hess)  # −∇²g is positive definite at a maximum
            mags = np.abs(vals)
            mags = np.maximum(mags, EIG_FLOOR * mags.max(axis=1, keepdims=True) + 1e-300)
            step = np.einsum("lij,lj->li", vecs, np.einsum("lji,lj->li", vecs, grad) / mags)
            length = np.linalg.norm(step, axis=1)
            step *= np.minimum(1.0, TRUST / np.maximum(length, 1e-300))[:, None]
            up = np.zeros(rows.size, dtype=bool)
            new = xr.copy()
            for _ in range(HALVINGS):
                cand = np.clip(xr + step, self.lo, self.hi)
                (g_new,) = self.correlation(cand, res)
                rise = ~up & (g_new > g[rows])
                new[rise] = cand[rise]
                up |= rise
                if up.all():
                    break
                step[~up] *= 0.5
            x[rows] = new
            rows = rows[np.abs(new - xr).max(axis=1) >= XTOL]
            if rows.size == 0:
                break
        return x
