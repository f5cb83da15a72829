"""Noise calibration: budgets, the sketch's sensitivities, noise scales, tails and composition.

The one module of MECHANISMS §0.6. Every function states its unit: a sensitivity is in the units
of the released quantity, and the returned scale is in the same units. ε is dimensionless, δ is a
probability (MECHANISMS §0.4). Sections: budget checks; the sensitivities of the sketch (one
function per released quantity, §1.2, §1.5–1.7); the scale of each noise primitive and the
discrete-Laplace tail (§1.5, §4.4); composition (§0.5, §9.5) and the Mahalanobis γ (§7.2).

SciPy is imported inside the two Gaussian calibrations that use it: every coordinator and device
process imports this module for the pure-DP scales, and ``scipy.optimize`` alone would add about
half a second to each one's start-up.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..choices import NEIGHBOURING
from ..features import ENTRY_L1, ENTRY_L2

#: Δ1 = Δ2 of the record count under add/remove (records).
COUNT_SENSITIVITY = 1.0
#: log of the probability, over all coordinates, that a noise vector leaves its radius (§4.4).
LOG_TAIL = -40.0 * math.log(2.0)


# ---------------------------------------------------------------- budget checks


def check_epsilon(epsilon: float) -> float:
    """Return ε if 0 < ε ≤ ∞ (∞ means: release without noise), else raise ValueError."""
    if not (epsilon > 0):  # also rejects NaN
        raise ValueError(f"epsilon must be > 0 (or inf for no noise), got {epsilon}")
    return float(epsilon)


def check_delta(delta: float) -> float:
    """Return δ if 0 ≤ δ < 1 (0 means pure ε-DP), else raise ValueError."""
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    return float(delta)


def check_neighbouring(neighbouring: str) -> str:
    """Return ``neighbouring`` if it is one of :data:`NEIGHBOURING`, else raise ValueError."""
    if neighbouring not in NEIGHBOURING:
        raise ValueError(
            f"unknown neighbouring relation {neighbouring!r}; "
            f"choose one of {', '.join(NEIGHBOURING)}"
        )
    return neighbouring


# ---------------------------------------------------------------- sensitivities of the sketch


def l1_sensitivity(feature: str, r: int, neighbouring: str) -> int:
    """Δ1 of the encoded integer sum S ∈ Z^{2m} (grid steps): 2rκ (replace-one), rκ (add/remove).

    A record touches r entries; each encoded entry has |Re q| + |Im q| ≤ κ = ``ENTRY_L1[feature]``,
    so a replace moves an entry by at most 2κ in L1 and an add or a remove by κ (MECHANISMS §1.5,
    §1.7, §1.10). ``quantized`` (κ = 2): 4r and 2r.
    """
    kappa = ENTRY_L1[feature]
    return 2 * r * kappa if check_neighbouring(neighbouring) == "replace_one" else r * kappa


def l2_sensitivity(feature: str, r: int, neighbouring: str) -> float:
    """Δ2 of the encoded integer sum S ∈ Z^{2m} (grid steps): 2√r·L (replace-one), √r·L (add/remove).

    L = ``ENTRY_L2[feature]`` bounds the modulus of one encoded entry (MECHANISMS §1.6, §1.10);
    ``quantized``: 2√2·√r and √2·√r.
    """
    per_entry = ENTRY_L2[feature] * math.sqrt(r)
    return 2.0 * per_entry if check_neighbouring(neighbouring) == "replace_one" else per_entry


# ---------------------------------------------------------------- noise scales and tails


def laplace_scale(delta1: float, epsilon: float) -> float:
    """Laplace scale b = Δ1/ε (variance 2b²) that makes a query of L1 sensitivity Δ1 ε-DP."""
    return delta1 / check_epsilon(epsilon)


def dlap_param(epsilon: float, delta1: float) -> float:
    """Discrete-Laplace parameter a = exp(−ε/Δ1) for an integer query of L1 sensitivity Δ1.

    P(k) = (1−a)/(1+a)·a^|k| on the integers; variance 2a/(1−a)².
    """
    return math.exp(-check_epsilon(epsilon) / delta1)


def dlap_variance(a: float) -> float:
    """Variance 2a/(1−a)² of DLap(a)."""
    return 2.0 * a / (1.0 - a) ** 2


def noise_radius(a: float, dim: int, shape: float = 1.0, log_tail: float = LOG_TAIL) -> int:
    """Smallest t ≥ 0 with dim · P(|Z| > t) ≤ 2^−40, Z = NB(ρ, 1−a) − NB(ρ, 1−a), ρ = ``shape``
    (``log_tail``: another natural log of the tail than ln 2^−40, for tests that measure it).

    t is in the units of the noise (integers). ρ = 1 is DLap(a), P(|Z| > t) = 2a^{t+1}/(1+a)
    (MECHANISMS §0.4, §4.4, union bound over ``dim`` coordinates). ρ > 1 (more than h_min
    submitters: ρ = m'/h_min, §4.3) uses P(|Z| > t) ≤ 2 P(X ≥ k), k = t+1, and the Chernoff bound
    P(X ≥ k) ≤ ((1−a)(k+ρ)/ρ)^ρ · (a(k+ρ)/k)^k for k > ρa/(1−a). a = 0 (no noise) gives 0.
    """
    if not 0.0 <= a < 1.0:
        raise ValueError(f"the discrete-Laplace parameter must lie in [0, 1), got {a}")
    if shape < 1.0:
        raise ValueError(f"shape = submitters / h_min must be >= 1, got {shape}")
    if a == 0.0:
        return 0
    budget = log_tail - math.log(2.0 * dim)
    if shape == 1.0:
        return max(math.ceil((budget + math.log1p(a)) / math.log(a)) - 1, 0)

    def fits(k: int) -> bool:
        log_p = shape * math.log((1 - a) * (k + shape) / shape) + k * math.log(a * (k + shape) / k)
        return log_p <= budget

    lo = math.floor(shape * a / (1 - a)) + 1  # the bound holds above the mean
    hi = 2 * lo
    while not fits(hi):
        lo, hi = hi, 2 * hi
    while lo < hi:  # the bound decreases in k above the mean
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return hi - 1


def gauss_sigma_classical(delta2: float, epsilon: float, delta: float) -> float:
    """Classical Gaussian σ = Δ2·√(2 ln(1.25/δ))/ε (Dwork–Roth Thm A.1); valid only for ε < 1."""
    if not 0 < epsilon < 1:
        raise ValueError(f"the classical Gaussian mechanism needs 0 < epsilon < 1, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta2 * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _gauss_delta(sigma: float, delta2: float, epsilon: float) -> float:
    """δ(σ) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), the exact δ of N(0, σ²) (Balle–Wang)."""
    from scipy.special import log_ndtr, ndtr  # here, not at the top: see the module docstring

    u = delta2 / (2.0 * sigma)
    v = epsilon * sigma / delta2
    return float(ndtr(u - v) - math.exp(epsilon + log_ndtr(-u - v)))


def gauss_sigma_analytic(delta2: float, epsilon: float, delta: float) -> float:
    """Smallest σ with δ(σ) ≤ δ for a query of L2 sensitivity Δ2 (Balle & Wang 2018, all ε > 0).

    δ(σ) decreases in σ; bisection on log σ to a relative width of 1e-12, returning the upper
    end, so the returned σ always satisfies the constraint.
    """
    check_epsilon(epsilon)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isinf(epsilon):
        return 0.0
    lo, hi = delta2 * 1e-6, delta2
    while _gauss_delta(hi, delta2, epsilon) > delta:
        lo, hi = hi, hi * 2.0
    while _gauss_delta(lo, delta2, epsilon) <= delta:
        lo /= 2.0
    while hi / lo > 1.0 + 1e-12:
        mid = math.sqrt(lo * hi)
        if _gauss_delta(mid, delta2, epsilon) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ the conversion of ρ-zCDP to (ε, δ)-DP gives (Canonne–Kamath–Steinke 2020, Cor. 13):

    δ = inf_{α>1} exp((α−1)(αρ−ε)) · (1 − 1/α)^{α−1} / α.

    Every α gives a valid δ, so an inexact minimizer errs on the safe side.
    """
    if rho <= 0:
        return 0.0
    from scipy.optimize import minimize_scalar  # here, not at the top: see the module docstring

    def log_delta(alpha: float) -> float:
        return (alpha - 1) * (alpha * rho - epsilon) + (alpha - 1) * math.log1p(-1 / alpha) - math.log(alpha)

    hi = max(2.0, (epsilon + 1.0) / (2.0 * rho) + 2.0)
    best = minimize_scalar(log_delta, bounds=(1.0 + 1e-9, hi), method="bounded",
                           options={"xatol": 1e-10})
    return min(1.0, math.exp(min(float(best.fun), log_delta(hi), 0.0)))


@lru_cache(maxsize=1024)
def dgauss_sigma(delta2: float, epsilon: float, delta: float) -> float:
    """Smallest σ (units of Δ2) with :func:`zcdp_delta`(Δ2²/(2σ²), ε) ≤ δ.

    The multivariate discrete Gaussian N_Z(0, σ²)^d on an integer query of L2 sensitivity Δ2 is
    Δ2²/(2σ²)-zCDP (CKS 2020, Thm 14); the conversion makes it (ε, δ)-DP. Bisection on log σ to
    a relative width of 1e-12, returning the upper end (memoized: a bisection costs milliseconds
    and the bench's mechanisms ask for the same σ in every trial). σ is above the continuous
    Gaussian's analytic σ (:func:`gauss_sigma_analytic`): by 4–14 % for δ ≤ 10⁻⁵ and ε ∈ [0.01, 10] (8.4 % at
    (1, 10⁻⁵)), by 10–42 % at δ = 10⁻² (17 % at ε = 1): the zCDP conversion is loose there.
    """
    check_epsilon(epsilon)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isinf(epsilon):
        return 0.0

    def ok(sigma: float) -> bool:
        return zcdp_delta(delta2 * delta2 / (2.0 * sigma * sigma), epsilon) <= delta

    lo, hi = delta2 * 1e-3, delta2
    while not ok(hi):
        lo, hi = hi, hi * 2.0
    while ok(lo):
        lo /= 2.0
    while hi / lo > 1.0 + 1e-12:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


# ---------------------------------------------------------------- composition and γ


def advanced_composition(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(ε', δ') of k adaptive (ε, δ)-DP mechanisms with slack δ'' = δ (MECHANISMS §0.5, §9.5).

    ε' = √(2k ln(1/δ))·ε + kε(e^ε − 1),  δ' = kδ + δ = (k + 1)δ  (Dwork–Roth Thm 3.20 with
    δ'' = δ, as paper 001 Prop. E.2). ε = ∞ gives ε' = ∞.
    """
    check_epsilon(epsilon)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if math.isinf(epsilon):
        return math.inf, (k + 1) * delta
    growth = math.expm1(epsilon) if epsilon < 700.0 else math.inf  # e^ε − 1 overflows past ~709
    eps_total = math.sqrt(2.0 * k * math.log(1.0 / delta)) * epsilon + k * epsilon * growth
    return eps_total, (k + 1) * delta


def advanced_composition_inverse(epsilon_total: float, delta_total: float, k: int) -> tuple[float, float]:
    """Per-mechanism (ε, δ) whose k-fold :func:`advanced_composition` is (ε', δ') (MECHANISMS §9.5).

    δ = δ'/(k + 1); ε' is increasing in ε, so ε is found by bisection to a relative width of
    1e-15, returning the lower end: the composed ε never exceeds ε'. ε' = ∞ gives ε = ∞.
    """
    check_epsilon(epsilon_total)
    if not 0 < delta_total < 1:
        raise ValueError(f"delta_total must be in (0, 1), got {delta_total}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    delta = delta_total / (k + 1)
    if math.isinf(epsilon_total):
        return math.inf, delta
    lo, hi = 0.0, epsilon_total
    while advanced_composition(hi, delta, k)[0] < epsilon_total:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-15 * hi:
        mid = 0.5 * (lo + hi)
        if advanced_composition(mid, delta, k)[0] > epsilon_total:
            hi = mid
        else:
            lo = mid
    return lo, delta


def gamma_mahalanobis(epsilon: float, delta: float) -> float:
    """Largest γ (dimensionless) such that noise of covariance Σ, released as a discrete Gaussian
    on the query whitened by Σ^{−1/2} and encoded on a grid (:mod:`.grid`), is (ε, δ)-DP for
    every pair of datasets whose query difference Δ satisfies ΔᵀΣ⁻¹Δ ≤ γ (MECHANISMS §7.2).

    Whitened, such a pair differs by s² = ΔᵀΣ⁻¹Δ under unit noise: a query of L2 sensitivity s
    under σ = 1, so γ = 1/σ_Z(1, ε, δ)² with σ_Z from :func:`dgauss_sigma` (the discrete Gaussian's
    zCDP bound, which errs upward, so γ errs downward; the grid's rounding is paid by the release).
    ε = ∞ gives γ = ∞ (no constraint).
    """
    sigma = dgauss_sigma(1.0, epsilon, delta)
    return math.inf if sigma == 0.0 else 1.0 / sigma**2
