"""CL-OMPR: decode k centroids and weights from a sketch (MECHANISMS §3, DESIGN §5).

Notation: sketch s ∈ C^m, public frequencies Ω ∈ R^{d×m} (inverse data units), dither ξ ∈ R^m
(radians), first harmonic γ of the feature map (``FIRST_HARMONIC`` in
:mod:`fedsketch.common.features`). The atom of a centroid c ∈ R^d (data units) is

    a(c) = γ·exp(i(Ωᵀc + ξ)) / √m ∈ C^m,    ‖a(c)‖ = γ for every c,

so u(c) = a(c)/‖a(c)‖ = exp(i(Ωᵀc + ξ))/√m is the unit atom. CL-OMPR solves, from local moves,

    min_{C, p ≥ 0} F(C, p) = ‖s − Σ_j p_j a(c_j)‖²   subject to lo ≤ c_j ≤ hi,

with 2k iterations (with replacement): (1) a new atom maximizing Re⟨u(c), res⟩ in the box,
(2) added to the support, (3) if the support exceeds k, hard thresholding by NNLS on unit atoms,
(4) NNLS weights on the atoms, (5) L-BFGS-B on all centroids and weights. The decoder never reads
data; replicates are ranked by sketch residual ‖res‖ only.

Everything runs in real arithmetic: C^m is R^{2m} (real parts, imaginary parts),
⟨u, v⟩ = Re(u^H v). Step 1 is :class:`fedsketch.server.decode.search.AtomSearch` (fresh uniform
candidates screened by correlation in float32, then a Newton ascent from the best few in
float64: it only proposes a start). Step 5's fits inside the loop use float32 cosines and sines
of phases reduced in float64 (their error in F, about 10⁻⁷·‖res‖, is far below FTOL_LOOP), the
final fit and every NNLS float64 ones (within 2.3·10⁻¹⁶ of ``np.cos``/``np.sin`` of the same θ).
Each objective evaluation is one compiled pass (:mod:`fedsketch.server.decode.kernels`: the
phases, each cos and sin once, the residual, F and its gradient; O(K·m·d), no Python loop over
atoms or frequencies), and L-BFGS-B calls it through SciPy's routine without the per-evaluation
wrapper of ``scipy.optimize.minimize`` (:mod:`fedsketch.server.decode.lbfgsb`). numba is imported
on a process's first decode and loads the compiled loops from its disk cache.
BLAS is pinned to one thread while decoding (DESIGN §8). SciPy is imported inside the functions that
call it: the coordinator imports this module at start-up and decodes later, if ever, and
``scipy.optimize`` took about half of a coordinator's start-up.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from threadpoolctl import ThreadpoolController

from fedsketch.server.decode.lbfgsb import minimize_box
from fedsketch.server.decode.search import AtomSearch

if TYPE_CHECKING:
    from scipy.optimize import Bounds

#: Step 1 (here :func:`best_atom`, and :class:`~fedsketch.server.decode.search.AtomSearch` in
#: the decoder) screens this many uniform candidates in the box by their correlation (one
#: O(L·m·d) product, no data read) and climbs from the best few: STARTS_GROW during the first k
#: iterations, STARTS_REPLACE during the replacement iterations.
CANDIDATES = 512
STARTS_GROW = 3
STARTS_REPLACE = 10
#: Weight bounds of step 5 (dimensionless; the weights sum to about 1 before renormalization).
WEIGHT_MIN = 1e-9
WEIGHT_MAX = 2.0
#: L-BFGS-B of step 5: ftol and iteration cap inside the loop, and for the final fine-tuning.
FTOL_LOOP = 1e-6
FTOL_FINAL = 0.02 * FTOL_LOOP
MAXITER_LOOP = 300
MAXITER_FINAL = 3000
#: Its gtol (SciPy's default for L-BFGS-B).
GTOL_FIT = 1e-5
#: L-BFGS-B of :func:`best_atom` (all starts jointly).
FTOL_ATOM = 1e-9
GTOL_ATOM = 1e-5
MAXITER_ATOM = 500

@dataclass(frozen=True)
class Frame:
    """The decoder's coordinates u = (x − c)/t: c the box's centre (data units), t = 1/rms(Ω)
    (data units; rms over Ω's entries), so that Ω_u = t·Ω is dimensionless with entries of rms 1
    and the box is [(lo − c)/t, (hi − c)/t]. The phases are unchanged, Ωᵀx + ξ = Ω_uᵀu + ξ_u with
    ξ_u = (ξ + Ωᵀc) mod 2π, so the sketch is the same function of u as of x.

    Every step size, tolerance and start of CL-OMPR (the L-BFGS-B ftol/gtol, the uniform starts,
    the weight bounds) is then stated in units where σ is about 1, whatever the data's units:
    data and box mapped by x ↦ a·x + b, with Ω ↦ Ω/a as the scale-free σ gives, decode to the
    mapped centroids (tests/common/sketch/test_equivariance.py); and the float32 phases of step 1 stay
    within the box's phase bound around ξ_u, however far the box lies from 0."""

    centre: np.ndarray
    unit: float

    @classmethod
    def of(cls, omega: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Frame:
        """The frame of frequencies Ω (d, m) and the box [lo, hi]."""
        rms = math.sqrt(float(np.mean(omega * omega)))
        unit = 1.0 / rms if rms > 0 else float(np.mean(hi - lo)) / 2.0
        return cls(lo / 2.0 + hi / 2.0, unit)

    def frequencies(self, omega: np.ndarray, xi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Ω_u, ξ_u) (class docstring)."""
        return omega * self.unit, np.mod(xi + self.centre @ omega, 2.0 * math.pi)

    def to_unit(self, x: np.ndarray) -> np.ndarray:
        """u = (x − c)/t."""
        return (x - self.centre) / self.unit

    def to_data(self, u: np.ndarray) -> np.ndarray:
        """x = c + t·u."""
        return self.centre + u * self.unit


@dataclass(frozen=True)
class DecodeResult:
    """The decoded mixture of Diracs.

    ``centroids`` (k, d) float64 in data units, inside the decoding box; ``weights`` (k,) float64,
    non-negative, summing to 1; ``residual`` = ‖s − Σ_j p_j a(c_j)‖ (Euclidean norm in C^m, same
    units as the sketch) with the weights p_j found by the decoder, before they are renormalized.
    """

    centroids: np.ndarray
    weights: np.ndarray
    residual: float


def _correlations(
    centroids: np.ndarray, omega: np.ndarray, xi: np.ndarray, res: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Step-1 correlations g(c_l) = Re⟨u(c_l), res⟩ for L candidates, and their gradients.

    ``centroids`` (L, d), ``res`` (2m,) = (Re res, Im res). With θ = Ωᵀc + ξ,
    g(c) = (1/√m) Σ_j (cos θ_j Re res_j + sin θ_j Im res_j) and
    ∇g(c) = (1/√m) Σ_j ω_j (cos θ_j Im res_j − sin θ_j Re res_j) = Ω·Im(conj(u(c)) ⊙ res).
    Returns g (L,) and ∇g (L, d) (sketch units per data unit).

    Step 1 only seeds step 5, so it runs in the dtype of ``omega``, ``xi`` and ``res``: float32
    (SIMD trigonometry, measured 15× faster than float64 here; phases |θ| ≲ 10³ rad keep a
    relative error below 1e-6 in g).
    """
    m = xi.size
    theta = centroids.astype(omega.dtype) @ omega + xi
    cos, sin = np.cos(theta), np.sin(theta)
    res_re, res_im = res[:m], res[m:]
    scale = 1.0 / math.sqrt(m)
    g = (cos @ res_re + sin @ res_im) * scale
    grad = ((cos * res_im - sin * res_re) @ omega.T) * scale
    return g, grad


def _step1_objective(
    x: np.ndarray, omega: np.ndarray, xi: np.ndarray, res: np.ndarray
) -> tuple[float, np.ndarray]:
    """−Σ_l g(c_l) and its gradient, for L starts stacked as x = vec(C), C (L, d) row-major.

    The sum is separable, so one L-BFGS-B run over all L·d variables optimizes every start.
    """
    g, grad = _correlations(x.reshape(-1, omega.shape[0]), omega, xi, res)
    return -float(g.sum(dtype=np.float64)), -grad.ravel().astype(np.float64)


@functools.cache
def _blas() -> ThreadpoolController:
    """The process's BLAS libraries, found once (threadpoolctl's search took about 10 ms, a
    seventh of a decode, when ``threadpool_limits`` repeated it at every call); first called
    by :func:`clompr` after SciPy's optimizers, and so their OpenBLAS, are loaded."""
    return ThreadpoolController()


def _kernels():
    """:mod:`fedsketch.server.decode.kernels`, imported on first use (numba loads only then)."""
    from fedsketch.server.decode import kernels

    return kernels


def _step5_objective(
    x: np.ndarray, omega: np.ndarray, xi: np.ndarray, sketch: np.ndarray, gain: float,
    trig32: bool = False,
) -> tuple[float, np.ndarray]:
    """F(C, p) = ‖s − Σ_j p_j a(c_j)‖² and its gradient, x = (vec(C), p), C (K, d) row-major.

    ``sketch`` (2m,) = (Re s, Im s); ``gain`` = γ/√m. With θ_j = Ωᵀc_j + ξ and
    res = s − gain·Σ_j p_j e^{iθ_j}:
    ∂F/∂p_j = −2 Re⟨a(c_j), res⟩ = −2·gain·Σ_l (cos θ_jl Re res_l + sin θ_jl Im res_l),
    ∇_{c_j}F = 2 p_j Ω·Im(a(c_j) ⊙ conj(res)) = −2·gain·p_j Σ_l ω_l (cos θ_jl Im res_l −
    sin θ_jl Re res_l).

    One compiled pass (:func:`fedsketch.server.decode.kernels.objective`) computes each cos θ and
    sin θ once, the residual, F and the gradient. With ``trig32`` the cosines and sines are
    float32 of phases reduced to [−π, π] (absolute error about 2·10⁻⁷, against float64's 10⁻¹⁶),
    the sums float64: the fits inside the loop stop at FTOL_LOOP, which that error in F stays
    well below (module docstring).
    """
    m = omega.shape[1]
    grad = np.empty(x.size)
    value = _kernels().objective(np.ascontiguousarray(x, dtype=np.float64), omega, xi,
                                 np.ascontiguousarray(sketch[:m]), np.ascontiguousarray(sketch[m:]),
                                 float(gain), bool(trig32), grad)
    return float(value), grad


def stacked_atoms(centroids: np.ndarray, omega: np.ndarray, xi: np.ndarray, gain: float) -> np.ndarray:
    """Stacked real atoms (2m, K): rows 0..m−1 = gain·cos θ, rows m..2m−1 = gain·sin θ."""
    return _kernels().atoms(np.ascontiguousarray(centroids, dtype=np.float64),
                            np.ascontiguousarray(omega, dtype=np.float64),
                            np.ascontiguousarray(xi, dtype=np.float64), float(gain))


def _residual(
    centroids: np.ndarray, p: np.ndarray, omega: np.ndarray, xi: np.ndarray,
    sketch: np.ndarray, gain: float,
) -> np.ndarray:
    """res = s − Σ_j p_j a(c_j) as (2m,) (real parts, imaginary parts)."""
    return sketch - stacked_atoms(centroids, omega, xi, gain) @ p


def best_atom(
    res: np.ndarray, omega: np.ndarray, xi: np.ndarray, bounds: Bounds, starts: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Argmax of Re⟨u(c), res⟩ over the box (d,), by L-BFGS-B: the noise ceiling's search
    (:mod:`fedsketch.server.decode.identify`), run once per spec and cached. The decoder's step 1
    is :class:`~fedsketch.server.decode.search.AtomSearch`, the same maximization by a batched
    Newton ascent (at most MAX_STEPS Newton steps where L-BFGS-B takes about 50 evaluations).

    ``CANDIDATES`` points uniform in the box ("Range" starts, never data) are screened by their
    correlation; L-BFGS-B runs from the ``starts`` best of them jointly.
    """
    from scipy.optimize import Bounds, minimize  # here, not at the top: see the module docstring

    lo, hi = bounds.lb, bounds.ub
    d = lo.size
    omega, xi, res = (a.astype(np.float32) for a in (omega, xi, res))
    cands = rng.uniform(lo, hi, size=(max(CANDIDATES, starts), d))
    g, _ = _correlations(cands, omega, xi, res)
    x0 = cands[np.argsort(g)[::-1][:starts]]
    box = Bounds(np.tile(lo, starts), np.tile(hi, starts))
    sol = minimize(
        _step1_objective, x0.ravel(), args=(omega, xi, res), method="L-BFGS-B", jac=True,
        bounds=box, options={"ftol": FTOL_ATOM, "gtol": GTOL_ATOM, "maxiter": MAXITER_ATOM},
    )
    cands = np.clip(sol.x.reshape(starts, d), lo, hi)
    g, _ = _correlations(cands, omega, xi, res)
    return cands[int(np.argmax(g))]


def _fit_all(
    centroids: np.ndarray, p: np.ndarray, omega: np.ndarray, xi: np.ndarray, sketch: np.ndarray,
    gain: float, bounds: Bounds, ftol: float, maxiter: int, trig32: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 5: L-BFGS-B on F(C, p) from (C, p), c_j in the box, p_j in [WEIGHT_MIN, WEIGHT_MAX]
    (:func:`fedsketch.server.decode.lbfgsb.minimize_box` on the compiled objective)."""
    k, d = centroids.shape
    m = omega.shape[1]
    lb = np.concatenate([np.tile(bounds.lb, k), np.full(k, WEIGHT_MIN)])
    ub = np.concatenate([np.tile(bounds.ub, k), np.full(k, WEIGHT_MAX)])
    objective = _kernels().objective
    sre, sim = np.ascontiguousarray(sketch[:m]), np.ascontiguousarray(sketch[m:])

    def fun(x: np.ndarray, grad: np.ndarray) -> float:
        return objective(x, omega, xi, sre, sim, gain, trig32, grad)

    x, _ = minimize_box(fun, np.concatenate([centroids.ravel(), p]), lb, ub, ftol, GTOL_FIT,
                        maxiter)
    x = np.clip(x, lb, ub)
    return x[: k * d].reshape(k, d), x[k * d :]


def _decode_once(
    sketch: np.ndarray, omega: np.ndarray, xi: np.ndarray, k: int, bounds: Bounds, gain: float,
    rng: np.random.Generator, tick: Callable[[], None],
) -> tuple[np.ndarray, np.ndarray, float]:
    """One CL-OMPR run (2k iterations, then a fine-tuning): (C (k, d), p (k,), ‖res‖).

    p is returned before renormalization. ``tick()`` is called after each iteration.
    """
    from scipy.optimize import nnls  # here, not at the top: see the module docstring

    d, m = omega.shape
    unit = 1.0 / math.sqrt(m)  # gain of the unit atoms u(c) = a(c)/‖a(c)‖
    centroids = np.empty((0, d))
    p = np.empty(0)
    res = sketch.copy()
    search = AtomSearch(omega, xi, bounds.lb, bounds.ub, rng)
    for t in range(2 * k):
        c = search(res, STARTS_GROW if t < k else STARTS_REPLACE)
        centroids = np.vstack([centroids, c])
        if centroids.shape[0] > k:
            beta, _ = nnls(stacked_atoms(centroids, omega, xi, unit), sketch)
            drop = int(np.argmin(beta))
            centroids = np.delete(centroids, drop, axis=0)
            if drop == k:  # the new atom was rejected: (C, p) and res are unchanged
                tick()
                continue
        p, _ = nnls(stacked_atoms(centroids, omega, xi, gain), sketch)
        centroids, p = _fit_all(
            centroids, p, omega, xi, sketch, gain, bounds, FTOL_LOOP, MAXITER_LOOP, True
        )
        res = _residual(centroids, p, omega, xi, sketch, gain)
        tick()
    centroids, p = _fit_all(centroids, p, omega, xi, sketch, gain, bounds, FTOL_FINAL, MAXITER_FINAL,
                            False)
    res = _residual(centroids, p, omega, xi, sketch, gain)
    return centroids, p, float(np.linalg.norm(res))


def _check_inputs(
    sketch: np.ndarray, omega: np.ndarray, xi: np.ndarray, k: int, lo: np.ndarray,
    hi: np.ndarray, harmonic: float, replicates: int,
) -> None:
    """Raise ValueError with a one-line message on any malformed input."""
    if omega.ndim != 2:
        raise ValueError(f"omega must be a (d, m) array, got shape {omega.shape}")
    d, m = omega.shape
    if d < 1 or m < 1:
        raise ValueError(f"omega must be a non-empty (d, m) array, got shape {omega.shape}")
    if sketch.shape != (m,):
        raise ValueError(f"sketch must have shape ({m},) to match omega, got {sketch.shape}")
    if xi.shape != (m,):
        raise ValueError(f"xi must have shape ({m},) to match omega, got {xi.shape}")
    if lo.shape != (d,) or hi.shape != (d,):
        raise ValueError(f"lo and hi must have shape ({d},), got {lo.shape} and {hi.shape}")
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    if m < k:
        raise ValueError(f"m must be ≥ k, got m = {m}, k = {k}")
    if replicates < 1:
        raise ValueError(f"replicates must be ≥ 1, got {replicates}")
    if not (math.isfinite(harmonic) and harmonic > 0):
        raise ValueError(f"harmonic must be positive and finite, got {harmonic}")
    if not np.all(np.isfinite(sketch)):
        raise ValueError("sketch has non-finite entries (NaN or inf)")
    if not (np.all(np.isfinite(omega)) and np.all(np.isfinite(xi))):
        raise ValueError("omega and xi must be finite")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError("bounds lo and hi must be finite")
    if np.any(lo >= hi):
        axis = int(np.argmax(lo >= hi))
        raise ValueError(f"bounds need lo < hi on every axis; axis {axis} has {lo[axis]} ≥ {hi[axis]}")


def clompr(
    sketch: np.ndarray,
    omega: np.ndarray,
    xi: np.ndarray,
    k: int,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    harmonic: float = 1.0,
    replicates: int = 1,
    rng: np.random.Generator | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DecodeResult:
    """Decode k centroids and weights from ``sketch`` by CL-OMPR with replacement (2k iterations).

    ``sketch`` (m,) complex, s = (1/n)Σ f(Ωᵀx_i + ξ)/√m (+ noise); ``omega`` (d, m) and ``xi``
    (m,) the public frequencies (inverse data units) and dither (radians) it was computed with;
    ``lo``, ``hi`` (d,) the public decoding box (data units); ``harmonic`` γ, the first-harmonic
    coefficient of the feature map (1 for ``complex``, 4/π for ``quantized``), so that atoms are
    a(c) = γ·exp(i(Ωᵀc + ξ))/√m.

    Runs ``replicates`` independent decodings and returns the one with the smallest sketch
    residual (never a criterion that reads data). Random starts (uniform in the box) are drawn
    from ``rng`` (a fresh unseeded generator if None), replicate after replicate: ``replicates=R``
    with generator g returns the best of R successive single-replicate calls with g.
    ``progress(done, total)`` is called after each CL-OMPR iteration, total = replicates·2k.
    """
    from scipy.optimize import Bounds  # here, not at the top: see the module docstring

    sketch = np.asarray(sketch)
    omega = np.asarray(omega, dtype=np.float64)
    xi = np.asarray(xi, dtype=np.float64)
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    _check_inputs(sketch, omega, xi, k, lo, hi, harmonic, replicates)
    rng = np.random.default_rng() if rng is None else rng
    s = sketch.astype(np.complex128)
    stacked = np.concatenate([s.real, s.imag])
    gain = harmonic / math.sqrt(omega.shape[1])
    total = replicates * 2 * k
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    frame = Frame.of(omega, lo, hi)
    omega_u, xi_u = frame.frequencies(omega, xi)
    bounds = Bounds(frame.to_unit(lo), frame.to_unit(hi))
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    with _blas().limit(limits=1):
        for _ in range(replicates):
            run = _decode_once(stacked, omega_u, xi_u, k, bounds, gain, rng, tick)
            if best is None or run[2] < best[2]:
                best = run
    centroids, p, residual = best
    return DecodeResult(centroids=np.clip(frame.to_data(centroids), lo, hi), weights=p / p.sum(),
                        residual=residual)
