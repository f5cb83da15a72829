"""Noise calibration: the scale of each noise primitive from a sensitivity and a budget.

Every function states its unit: a sensitivity is in the units of the released quantity, and the
returned scale is in the same units. ε is dimensionless, δ is a probability (MECHANISMS §0.4).
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr, ndtr


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


def gauss_sigma_classical(delta2: float, epsilon: float, delta: float) -> float:
    """Classical Gaussian σ = Δ2·√(2 ln(1.25/δ))/ε (Dwork–Roth Thm A.1); valid only for ε < 1."""
    if not 0 < epsilon < 1:
        raise ValueError(f"the classical Gaussian mechanism needs 0 < epsilon < 1, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return delta2 * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _gauss_delta(sigma: float, delta2: float, epsilon: float) -> float:
    """δ(σ) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), the exact δ of N(0, σ²) (Balle–Wang)."""
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
