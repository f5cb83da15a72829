"""Where privacy noise is drawn: the CSPRNG-seeded generator and the samplers of each law.

Privacy noise never comes from a user or study seed: every draw uses a generator from
:func:`noise_rng` (MECHANISMS §0.4 for the laws, §4.2 for the secure-aggregation shares).
"""

from __future__ import annotations

import math
import secrets

import numpy as np

from .budget import NoiseTerm
from .calibration import check_epsilon


def noise_rng() -> np.random.Generator:
    """A fresh PCG64 generator seeded with 128 bits from the OS CSPRNG (``secrets``).

    Privacy noise never comes from a user or study seed; there is deliberately no seed argument.
    """
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def discrete_laplace(rng: np.random.Generator, a: float, size: int) -> np.ndarray:
    """Draw ``size`` int64 samples of DLap(a): P(k) ∝ a^|k|, as G1 − G2 with G ~ Geom(1−a) on {0,1,…}."""
    p = -math.expm1(math.log(a))  # 1 − a without cancellation
    return (rng.geometric(p, size) - rng.geometric(p, size)).astype(np.int64)


def draw(term: NoiseTerm, rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` i.i.d. draws of ``term``'s law at its scale, in the units of its target.

    Laplace: float64 Lap(b); Gaussian: float64 N(0, σ²); discrete Laplace: int64 DLap(a).
    """
    if term.law == "laplace":
        return rng.laplace(0.0, term.scale, size)
    if term.law == "gaussian":
        return rng.normal(0.0, term.scale, size)
    if term.law == "discrete_laplace":
        return discrete_laplace(rng, term.scale, size)
    raise ValueError(f"unknown noise law {term.law!r}")


def dlap_noise_share(epsilon: float, delta1: float, h_min: int, dim: int,
                     rng: np.random.Generator) -> np.ndarray:
    """One device's int64 noise share: NB(1/h_min, 1−a) − NB(1/h_min, 1−a) per coordinate.

    a = exp(−ε/Δ1) with Δ1 the sensitivity of the *total* integer sum (4r, replace-one, in
    integer-sum units). The shares of h_min devices sum in law to one DLap(a) draw per coordinate
    (MECHANISMS §4.2; numpy's Gamma–Poisson sampler is integer-valued but only approximately
    exact, §10 item 7). ``rng`` must come from :func:`noise_rng` (OS CSPRNG seed).
    """
    if h_min < 1 or delta1 <= 0:
        raise ValueError(f"need h_min >= 1 and delta1 > 0, got {h_min}, {delta1}")
    p = -math.expm1(-check_epsilon(epsilon) / delta1)  # 1 − a without cancellation
    return (rng.negative_binomial(1.0 / h_min, p, dim)
            - rng.negative_binomial(1.0 / h_min, p, dim)).astype(np.int64)
