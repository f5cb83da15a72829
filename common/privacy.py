"""The private sketch: noise calibrated to each feature map and neighbouring relation.

Given S = Σ_i f(Ωᵀx_i + ξ) ⊙ b_i (:mod:`fedsketch.common.sketching`), with α = r/m, c_f from
:mod:`fedsketch.common.features`, and noise from a generator seeded from the OS CSPRNG:

replace-one (n public), δ = 0 (MECHANISMS §1.1–1.2, §1.5)
    ``complex``:   s = S/(α n √m) + w,  w_j^re, w_j^im ~ Lap(b),  b = c_f √m/(n ε)  (Δ1 = c_f √m/n)
    ``quantized``: S~ = S + N, N ~ DLap(a) on each of the 2m integers, a = exp(−ε/(4r)),
                   s = S~/(α n √m); S~ is the integer payload.
replace-one, δ > 0 (§1.6): s = S/(α n √m) + N(0, σ²) per real coordinate,
    σ = analytic-Gaussian(Δ2, ε, δ),  Δ2 = g √m/(n √r),  g = 2 (complex) or 2√2 (quantized).
add/remove (n private), δ = 0 (§1.7): ε = ε1 + ε2, ε1 = ε·2m/(2m+1);
    num = S/(α√m) + Lap((c_f/2)√m/ε1), den = n + Lap(1/ε2)            (``complex``)
    num = (S + DLap(e^{−ε1/(2r)}))/(α√m), den = n + DLap(e^{−ε2})        (``quantized``)
    s = num / max(den, 1);  the released count is den, never n.
add/remove, δ > 0: one Gaussian σ on the joint vector (num, den), Δ2 = √(g'² m/r + 1),
    g' = 1 (complex) or √2 (quantized).

ε = ∞ releases the clean sketch (no noise), for non-private baselines.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass

import numpy as np

from .calibration import (
    check_delta,
    check_epsilon,
    dlap_param,
    dlap_variance,
    gauss_sigma_analytic,
)
from .features import C_F, MAX_ENTRY_CHANGE
from .sketching import FeatureSum

NEIGHBOURING: tuple[str, ...] = ("replace_one", "add_remove")


@dataclass(frozen=True)
class PrivacySpec:
    """The budget of one release: ε (∞ = no noise), δ (0 = pure DP), and the neighbouring relation."""

    epsilon: float
    delta: float = 0.0
    neighbouring: str = "replace_one"

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_delta(self.delta)
        if self.neighbouring not in NEIGHBOURING:
            raise ValueError(
                f"unknown neighbouring relation {self.neighbouring!r}; "
                f"choose one of {', '.join(NEIGHBOURING)}"
            )

    @property
    def noiseless(self) -> bool:
        """True when ε = ∞: the release carries no noise and no privacy guarantee."""
        return math.isinf(self.epsilon)

    def to_dict(self) -> dict:
        """JSON-ready form (ε = ∞ is written as the string "inf")."""
        out = asdict(self)
        out["epsilon"] = "inf" if self.noiseless else self.epsilon
        return out

    @classmethod
    def from_dict(cls, data: dict) -> PrivacySpec:
        """Inverse of :meth:`to_dict`."""
        return cls(float(data["epsilon"]), float(data["delta"]), str(data["neighbouring"]))


@dataclass(frozen=True)
class NoiseTerm:
    """One noise draw: its law, the sensitivity it covers and its scale, in the units of ``target``.

    law: ``laplace`` (scale b), ``discrete_laplace`` (parameter a), ``gaussian`` (σ).
    """

    target: str
    law: str
    epsilon: float
    sensitivity: float
    scale: float


@dataclass(frozen=True)
class PrivateSketch:
    """A released sketch and how it was noised.

    ``sketch`` is the normalized complex sketch (≈ (1/n)Σ f(Ωᵀx+ξ)/√m plus noise). ``n`` is the
    record count as released: exact under replace-one, noisy under add/remove. ``variance`` is
    the variance of the noise on each real coordinate of ``sketch`` (sketch units², given the
    released count; 0 without noise): public, since it follows from the spec and the release.
    ``payload`` holds the noisy integers (re and im stacked, int64, length 2m) when the release
    is an integer one.
    """

    sketch: np.ndarray
    n: float
    privacy: PrivacySpec
    noise: tuple[NoiseTerm, ...]
    variance: float = 0.0
    payload: np.ndarray | None = None

    def mechanism(self) -> dict:
        """JSON-ready description of the noise terms."""
        return {"privacy": self.privacy.to_dict(), "noise": [asdict(t) for t in self.noise]}


def noise_rng() -> np.random.Generator:
    """A fresh PCG64 generator seeded with 128 bits from the OS CSPRNG (``secrets``).

    Privacy noise never comes from a user or study seed; there is deliberately no seed argument.
    """
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def discrete_laplace(rng: np.random.Generator, a: float, size: int) -> np.ndarray:
    """Draw ``size`` int64 samples of DLap(a): P(k) ∝ a^|k|, as G1 − G2 with G ~ Geom(1−a) on {0,1,…}."""
    p = -math.expm1(math.log(a))  # 1 − a without cancellation
    return (rng.geometric(p, size) - rng.geometric(p, size)).astype(np.int64)


def privatize(fs: FeatureSum, privacy: PrivacySpec) -> PrivateSketch:
    """Release ``fs`` under ``privacy`` with fresh CSPRNG noise (see the module docstring)."""
    if privacy.noiseless:
        return PrivateSketch(fs.clean_sketch(), float(fs.n), privacy, ())
    if privacy.delta > 0:
        return _gaussian(fs, privacy)
    if privacy.neighbouring == "replace_one":
        return _replace_one_pure(fs, privacy)
    return _add_remove_pure(fs, privacy)


def _stacked(fs: FeatureSum) -> np.ndarray:
    return np.concatenate([fs.re, fs.im])


def _release(
    fs: FeatureSum,
    privacy: PrivacySpec,
    noise: tuple[NoiseTerm, ...],
    payload: np.ndarray | None,
    n_released: float,
    values: np.ndarray,
    variance: float,
) -> PrivateSketch:
    """Build the release from the stacked real values (re then im) of the noisy sketch."""
    sketch = values[: fs.m] + 1j * values[fs.m:]
    return PrivateSketch(
        sketch.astype(np.complex128), n_released, privacy, noise, variance, payload
    )


def _replace_one_pure(fs: FeatureSum, privacy: PrivacySpec) -> PrivateSketch:
    rng = noise_rng()
    eps, m, n = privacy.epsilon, fs.m, fs.n
    if fs.feature == "quantized":
        delta1 = 4.0 * fs.r
        a = dlap_param(eps, delta1)
        payload = _stacked(fs) + discrete_laplace(rng, a, 2 * m)
        term = NoiseTerm("integer sum", "discrete_laplace", eps, delta1, a)
        norm = fs.alpha * n * math.sqrt(m)
        variance = dlap_variance(a) / norm**2
        return _release(fs, privacy, (term,), payload, float(n), payload / norm, variance)
    delta1 = C_F[fs.feature] * math.sqrt(m) / n
    b = delta1 / eps
    values = _stacked(fs) / (fs.alpha * n * math.sqrt(m)) + rng.laplace(0.0, b, 2 * m)
    term = NoiseTerm("normalized sketch", "laplace", eps, delta1, b)
    return _release(fs, privacy, (term,), None, float(n), values, 2.0 * b * b)


def add_remove_split(epsilon: float, m: int) -> tuple[float, float]:
    """(ε1, ε2) = (ε·2m/(2m+1), ε/(2m+1)): the numerator's and the count's shares of ε (§1.7)."""
    return epsilon * 2 * m / (2 * m + 1), epsilon / (2 * m + 1)


def _add_remove_pure(fs: FeatureSum, privacy: PrivacySpec) -> PrivateSketch:
    rng = noise_rng()
    m = fs.m
    eps1, eps2 = add_remove_split(privacy.epsilon, m)
    scale = 1.0 / (fs.alpha * math.sqrt(m))
    if fs.feature == "quantized":
        delta1 = 2.0 * fs.r
        a_num, a_den = dlap_param(eps1, delta1), dlap_param(eps2, 1.0)
        payload = _stacked(fs) + discrete_laplace(rng, a_num, 2 * m)
        den = float(fs.n + discrete_laplace(rng, a_den, 1)[0])
        terms = (
            NoiseTerm("integer sum", "discrete_laplace", eps1, delta1, a_num),
            NoiseTerm("record count", "discrete_laplace", eps2, 1.0, a_den),
        )
        norm = max(den, 1.0) / scale
        variance = dlap_variance(a_num) / norm**2
        return _release(fs, privacy, terms, payload, den, payload / norm, variance)
    delta1 = C_F[fs.feature] / 2.0 * math.sqrt(m)
    num = _stacked(fs) * scale + rng.laplace(0.0, delta1 / eps1, 2 * m)
    den = fs.n + float(rng.laplace(0.0, 1.0 / eps2))
    terms = (
        NoiseTerm("numerator (1/α)Σ z⊙b", "laplace", eps1, delta1, delta1 / eps1),
        NoiseTerm("record count", "laplace", eps2, 1.0, 1.0 / eps2),
    )
    variance = 2.0 * (delta1 / eps1) ** 2 / max(den, 1.0) ** 2
    return _release(fs, privacy, terms, None, den, num / max(den, 1.0), variance)


def _gaussian(fs: FeatureSum, privacy: PrivacySpec) -> PrivateSketch:
    rng = noise_rng()
    eps, delta, m, n = privacy.epsilon, privacy.delta, fs.m, fs.n
    g = MAX_ENTRY_CHANGE[fs.feature]
    if privacy.neighbouring == "replace_one":
        delta2 = g * math.sqrt(m) / (n * math.sqrt(fs.r))
        sigma = gauss_sigma_analytic(delta2, eps, delta)
        values = _stacked(fs) / (fs.alpha * n * math.sqrt(m)) + rng.normal(0.0, sigma, 2 * m)
        term = NoiseTerm("normalized sketch", "gaussian", eps, delta2, sigma)
        return _release(fs, privacy, (term,), None, float(n), values, sigma * sigma)
    delta2 = math.sqrt((g / 2.0) ** 2 * m / fs.r + 1.0)
    sigma = gauss_sigma_analytic(delta2, eps, delta)
    num = _stacked(fs) / (fs.alpha * math.sqrt(m)) + rng.normal(0.0, sigma, 2 * m)
    den = fs.n + float(rng.normal(0.0, sigma))
    term = NoiseTerm("(numerator, record count)", "gaussian", eps, delta2, sigma)
    variance = sigma * sigma / max(den, 1.0) ** 2
    return _release(fs, privacy, (term,), None, den, num / max(den, 1.0), variance)
