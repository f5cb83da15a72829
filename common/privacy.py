"""The private sketch: a feature sum released with the noise of its plan.

Given S = Σ_i f(Ωᵀx_i + ξ) ⊙ b_i (:mod:`fedsketch.common.sketching`), with α = r/m, c_f from
:mod:`fedsketch.common.features`, noise terms from :func:`fedsketch.common.dp.plan.noise_plan` and
draws from a generator seeded from the OS CSPRNG (:func:`noise_rng`, looked up here at each release):

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

:class:`PrivacySpec`, ``NEIGHBOURING`` and :func:`noise_rng` live in :mod:`fedsketch.common.dp` and
are re-exported here, the public home of the release.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .dp.budget import NoiseTerm, PrivacySpec
from .dp.calibration import NEIGHBOURING, dlap_variance
from .dp.plan import noise_plan
from .dp.samplers import draw, noise_rng
from .sketching import FeatureSum

__all__ = ["NEIGHBOURING", "PrivacySpec", "PrivateSketch", "noise_rng", "privatize"]


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


def privatize(fs: FeatureSum, privacy: PrivacySpec) -> PrivateSketch:
    """Release ``fs`` under ``privacy`` with fresh CSPRNG noise (see the module docstring)."""
    if privacy.noiseless:
        return PrivateSketch(fs.clean_sketch(), float(fs.n), privacy, ())
    terms = noise_plan(fs.feature, fs.m, fs.r, privacy, fs.n)
    rng = noise_rng()  # this module's name, so that tests can seed it
    if privacy.neighbouring == "replace_one":
        return _replace_one(fs, privacy, terms, rng)
    return _add_remove(fs, privacy, terms, rng)


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


def _replace_one(fs: FeatureSum, privacy: PrivacySpec, terms: tuple[NoiseTerm, ...],
                 rng: np.random.Generator) -> PrivateSketch:
    """n public: one term, on the integer sum S (then s = S~/(α n √m)) or on s itself."""
    (term,) = terms
    m, n = fs.m, fs.n
    if term.law == "discrete_laplace":
        payload = _stacked(fs) + draw(term, rng, 2 * m)
        norm = fs.alpha * n * math.sqrt(m)
        variance = dlap_variance(term.scale) / norm**2
        return _release(fs, privacy, terms, payload, float(n), payload / norm, variance)
    values = _stacked(fs) / (fs.alpha * n * math.sqrt(m)) + draw(term, rng, 2 * m)
    b = term.scale
    variance = 2.0 * b * b if term.law == "laplace" else b * b  # Lap(b): 2b²; N(0, σ²): σ²
    return _release(fs, privacy, terms, None, float(n), values, variance)


def _add_remove(fs: FeatureSum, privacy: PrivacySpec, terms: tuple[NoiseTerm, ...],
                rng: np.random.Generator) -> PrivateSketch:
    """n private: s = num / max(den, 1), num and den each noised by their term (module docstring).

    The count is drawn after the 2m coordinates, from the second term or, for the Gaussian, from
    the same joint term.
    """
    num_term, count_term = terms[0], terms[-1]
    m = fs.m
    if num_term.law == "discrete_laplace":
        scale = 1.0 / (fs.alpha * math.sqrt(m))
        payload = _stacked(fs) + draw(num_term, rng, 2 * m)
        den = float(fs.n + draw(count_term, rng, 1)[0])
        norm = max(den, 1.0) / scale
        variance = dlap_variance(num_term.scale) / norm**2
        return _release(fs, privacy, terms, payload, den, payload / norm, variance)
    # The Laplace numerator multiplies by 1/(α√m) and the Gaussian one divides by α√m: the two
    # roundings of the releases as they have always been made, kept bit for bit.
    if num_term.law == "laplace":
        num = _stacked(fs) * (1.0 / (fs.alpha * math.sqrt(m))) + draw(num_term, rng, 2 * m)
        den = fs.n + float(draw(count_term, rng, 1)[0])
        variance = 2.0 * num_term.scale**2 / max(den, 1.0) ** 2
    else:
        num = _stacked(fs) / (fs.alpha * math.sqrt(m)) + draw(num_term, rng, 2 * m)
        den = fs.n + float(draw(count_term, rng, 1)[0])
        variance = num_term.scale * num_term.scale / max(den, 1.0) ** 2
    return _release(fs, privacy, terms, None, den, num / max(den, 1.0), variance)
