"""The private sketch: an encoded integer feature sum released with the noise of its plan.

Given the encoded sum S = Σ_i q(Ωᵀx_i + ξ) ⊙ b_i ∈ Z^{2m} (grid steps, γ per unit;
:mod:`fedsketch.common.sketch.sketching`) and the terms of :func:`fedsketch.common.dp.plan.noise_plan`,
the release is the integer vector

    S~ = S + N,   N drawn exactly from the plan's first term (DLap or discrete Gaussian),

and, under add/remove, the integer count n~ = n + DLap(e^{−ε2}); under replace-one the count
n is public and released as is (MECHANISMS §1.1, §1.5–1.7, §1.10). Both maps share this one path;
every released value is an integer on the public grid, so the release carries no float noise
(§1.9 item 7). The normalized sketch s = S~/(γ·α·max(n~, 1)·√m) is post-processing.

ε = ∞ releases S itself (no noise), for non-private baselines.

:class:`PrivacySpec` and ``NEIGHBOURING`` live in :mod:`fedsketch.common.dp` and are re-exported
here, the public home of the release.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..dp.budget import NoiseTerm, PrivacySpec
from ..dp.calibration import NEIGHBOURING, dlap_variance
from ..dp.plan import noise_plan
from ..dp.samplers import draw
from .sketching import FeatureSum, normalized_sketch, sketch_norm

__all__ = ["NEIGHBOURING", "PrivacySpec", "PrivateSketch", "privatize"]


@dataclass(frozen=True)
class PrivateSketch:
    """A released sketch: the noisy integers, the released count, and how they were noised.

    ``payload`` is S~ ∈ Z^{2m} (int64, re then im, grid steps); ``n`` the record count as
    released (an integer: exact under replace-one, noisy under add/remove); ``grid`` γ and
    ``alpha`` α = r/m are public. ``variance`` is the variance of the noise on each real
    coordinate of :attr:`sketch` (sketch units², given the released count; 0 without noise).
    """

    payload: np.ndarray
    n: int
    grid: int
    alpha: float
    privacy: PrivacySpec
    noise: tuple[NoiseTerm, ...]
    variance: float = 0.0

    @property
    def m(self) -> int:
        """The number of complex entries."""
        return self.payload.size // 2

    @property
    def sketch(self) -> np.ndarray:
        """The normalized sketch s = S~/(γ·α·max(n, 1)·√m), complex128 (m,)."""
        return normalized_sketch(self.payload[: self.m], self.payload[self.m:], self.grid,
                                 self.alpha, self.n)

    def mechanism(self) -> dict:
        """JSON-ready description of the noise terms."""
        return {"privacy": self.privacy.to_dict(), "noise": [asdict(t) for t in self.noise]}


def privatize(fs: FeatureSum, privacy: PrivacySpec) -> PrivateSketch:
    """Release ``fs`` under ``privacy`` with fresh exact noise from OS bits (module docstring).

    ValueError for n = 0 under replace-one (n is public there, and no records is no sketch);
    under add/remove n = 0 is released like any n (refusing would reveal it)."""
    if fs.n == 0 and privacy.neighbouring == "replace_one":
        raise ValueError("no records to sketch")
    clean = np.concatenate([fs.re, fs.im]).astype(np.int64)
    if privacy.noiseless:
        return PrivateSketch(clean, fs.n, fs.grid, fs.alpha, privacy, ())
    terms = noise_plan(fs.feature, fs.m, fs.r, privacy)
    payload = clean + draw(terms[0], 2 * fs.m)
    n = fs.n if privacy.neighbouring == "replace_one" else int(fs.n + draw(terms[1], 1)[0])
    variance = coordinate_variance(terms[0], fs.grid, fs.alpha, n, fs.m)
    return PrivateSketch(payload, n, fs.grid, fs.alpha, privacy, terms, variance)


def coordinate_variance(term: NoiseTerm, grid: int, alpha: float, n: float, m: int) -> float:
    """Variance (sketch units²) that one draw of ``term`` on the integer sums (grid steps) puts
    on each real coordinate of the normalized sketch of n released records:
    Var(draw)/(γ·α·max(n, 1)·√m)²."""
    return term_variance(term) / sketch_norm(grid, alpha, n, m) ** 2


def term_variance(term: NoiseTerm) -> float:
    """Variance of one draw of ``term`` (its units): 2a/(1−a)² for DLap(a); σ² bounds the
    discrete Gaussian's (CKS 2020, Cor. 9), and is what is reported."""
    if term.law == "discrete_laplace":
        return dlap_variance(term.scale)
    return term.scale * term.scale
