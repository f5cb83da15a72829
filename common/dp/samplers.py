"""Where privacy noise is drawn: the exact integer samplers of every noisy release, and the
CSPRNG-seeded generator of the bench's float samplers.

Sketch releases, secure-aggregation shares and the integer releases of the centralized
mechanisms (MECHANISMS §1.9 item 7, §4.2; :mod:`fedsketch.common.dp.grid`) draw every value from
the exact samplers of :mod:`fedsketch.common.dp.exact`, which read only OS random bits and decide
no sample with a float: the law of a term is a function of its exact parameters, ε and the
sensitivity read as rationals (a float is an exact dyadic rational), never of a rounded
a = exp(−ε/Δ1). What the bench still samples in floating point (the Gibbs chains of the
exponential mechanisms, sample-and-aggregate's smooth-sensitivity noise) draws from
:func:`noise_rng` (a generator seeded from the OS CSPRNG, never from a user or study seed), and
its outcome says so.
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction

import numpy as np

from . import exact
from .budget import NoiseTerm
from .calibration import check_epsilon


def noise_rng() -> np.random.Generator:
    """A fresh PCG64 generator seeded with 128 bits from the OS CSPRNG (``secrets``).

    Privacy noise never comes from a user or study seed; there is deliberately no seed argument.
    """
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def dlap_rate(epsilon: float, delta1: float) -> Fraction:
    """λ = ε/Δ1 as an exact rational: DLap(e^{−λ}) on a query of L1 sensitivity Δ1 is ε-DP."""
    return Fraction(check_epsilon(epsilon)) / Fraction(delta1)


#: Largest noise scale, in integer units, of :func:`dlap_noise` (Δ1/ε) and :func:`dgauss_noise`
#: (σ): beyond it a draw could leave the int64 range (the exact samplers' own limits).
MAX_SCALE = 2**50
#: Largest rate λ = ε/Δ1 of :func:`dlap_noise_share`: the exact negative-binomial sampler's cost
#: grows faster than λ (25 ms at 1,000, 5 s at 10,000 for five draws), and beyond it a share is
#: 0 but for a probability below e^{−1024}, so a larger ε buys nothing.
MAX_SHARE_RATE = 1024


def dlap_noise(epsilon: float, delta1: float, shape: int | tuple[int, ...]) -> np.ndarray:
    """int64 array of i.i.d. DLap draws, P(k) ∝ e^{−ε|k|/Δ1}: ε-DP noise for an integer query of
    L1 sensitivity Δ1 (in the query's integer units), exactly, from OS random bits. ValueError if
    the scale Δ1/ε exceeds MAX_SCALE."""
    rate = dlap_rate(epsilon, delta1)
    if rate * MAX_SCALE < 1:
        raise ValueError(f"the noise scale Δ1/ε = {delta1:g}/{epsilon:g} exceeds {MAX_SCALE:.3g} "
                         "integer steps: ε is too small for an integer release")
    return exact.discrete_laplace(rate, int(np.prod(shape))).reshape(shape)


def dgauss_noise(sigma: float, shape: int | tuple[int, ...]) -> np.ndarray:
    """int64 array of i.i.d. discrete Gaussian draws, P(k) ∝ e^{−k²/(2σ²)} (σ in integer units),
    exactly, from OS random bits. ValueError if σ exceeds MAX_SCALE."""
    if not sigma <= MAX_SCALE:
        raise ValueError(f"the noise's σ = {sigma:.4g} integer steps exceeds {MAX_SCALE:.3g}: ε is too "
                         "small for an integer release")
    return exact.discrete_gaussian(Fraction(sigma) ** 2, int(np.prod(shape))).reshape(shape)


def draw(term: NoiseTerm, size: int) -> np.ndarray:
    """``size`` i.i.d. int64 draws of ``term``'s integer law, exactly, from OS random bits.

    ``discrete_laplace``: P(k) ∝ e^{−ε|k|/Δ1} (ε = ``term.epsilon``, Δ1 = ``term.sensitivity``);
    ``discrete_gaussian``: P(k) ∝ e^{−k²/(2σ²)}, σ = ``term.scale``.
    """
    if term.law == "discrete_laplace":
        return dlap_noise(term.epsilon, term.sensitivity, size)
    if term.law == "discrete_gaussian":
        return dgauss_noise(term.scale, size)
    raise ValueError(f"no exact sampler for the noise law {term.law!r}")


def dlap_noise_share(epsilon: float, delta1: float, h_min: int, dim: int) -> np.ndarray:
    """One device's int64 noise share: NB(1/h_min, a) − NB(1/h_min, a) per coordinate, exactly.

    a = exp(−ε/Δ1) with Δ1 the sensitivity of the *total* integer sum (2rκ, replace-one, in grid
    steps). The shares of h_min devices sum in law to one DLap(a) draw per coordinate
    (MECHANISMS §4.2). ε = ∞ gives zeros.
    """
    if h_min < 1 or delta1 <= 0:
        raise ValueError(f"need h_min >= 1 and delta1 > 0, got {h_min}, {delta1}")
    if math.isinf(check_epsilon(epsilon)):
        return np.zeros(dim, dtype=np.int64)
    return exact.dlap_share(share_rate(epsilon, delta1), h_min, dim)


def share_rate(epsilon: float, delta1: float) -> Fraction:
    """:func:`dlap_rate` of a noise share; ValueError past MAX_SHARE_RATE (ε too large to be
    worth sampling exactly: say so rather than spend minutes drawing zeros)."""
    rate = dlap_rate(epsilon, delta1)
    if rate > MAX_SHARE_RATE:
        raise ValueError(f"ε/Δ1 = {float(rate):.4g} exceeds {MAX_SHARE_RATE}: a noise share "
                         "would be 0 but for a negligible probability; ask for a smaller ε")
    return rate
