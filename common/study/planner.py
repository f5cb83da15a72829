"""Will a study's sketch decode? A prediction from the study's public spec and a record count.

Units: the normalized aggregate sketch s ∈ C^m is dimensionless, s = ΣS~/(γ·α·N·√m) (γ grid
steps per unit, α = r/m, N released records in all); an atom u(c) = e^{i(Ωᵀc + ξ)}/√m has unit
norm. Everything below is in those units, per real coordinate (2m of them).

**Noise.** The noise e of s is public (:func:`noise_variance`): independent across the 2m real
coordinates, each of variance

    v = draws·Var(one noise draw)/(γ·α·N·√m)² + (1 − α)·q/(α·N·m),

with the draw the spec's (:func:`fedsketch.common.dp.plan.noise_plan`, grid steps), ``draws`` the
number of full draws in the sum (L devices with local noise; L/h_min under secure aggregation,
whose devices each add 1/h_min of one draw), and q = E[(Re f)²] of one record's feature (1/2 for
``complex``, 1 for ``quantized``) for the subsampling of r < m entries. For DLap noise at
sketch ε: Var ≈ 2(Δ1/ε)² with Δ1 = 2rκ, so √v ≈ 2√2·κ/γ·√m/(N·ε)·√draws: it grows as √m and
falls as N·ε, whatever r.

**Signal.** Records of a cluster with weight w_j around c_j, spread with characteristic function
φ, add w_j·h·φ(ω_l)·e^{i(ω_lᵀc_j + ξ_l)}/√m to entry l, h the feature's first harmonic (1 for
``complex``, 4/π for ``quantized``). Its component along the unit atom u(c_j), the weight the
decoder gives centroid j, is

    p_j = w_j·h·κ̄,   κ̄ = (1/m)·Σ_l φ(ω_l)   (dimensionless, ≤ 1).

The spread is private, so the planner assumes the case the spec's scale σ is made for: clusters
of isotropic Gaussian spread with standard deviation CLUSTER_SPREAD·σ (the decoder needs σ ≈ twice
the cluster standard deviation: ``benchmarks/RESULTS.md`` §1), φ(ω) = exp(−½·(σ/2)²·‖ω‖²),
κ̄ computed on the spec's own Ω (0.78 for the ``adapted_radius`` law, in every d); and equal
weights w_j = 1/k. Point-like clusters give κ̄ = 1 (a signal at most 1.3× larger); wider ones, or
a small cluster, less.

**Prediction.** Centroid j stands out by z_j = p_j/√v noise standard deviations (the decoder's
own measure, :mod:`fedsketch.server.decode.identify`); the planner predicts z = h·κ̄/(k·√v). The
decoder calls a centroid signal when z_j clears a threshold T (what noise alone gives an atom in
the box, plus 3, measured on pure-noise sketches of the same Ω; 8.7–9.9 at d = 5–10, m = 1000).
The verdict: ``hopeless`` if z < T (a centroid of average weight is expected below the
threshold), ``doubtful`` if z < SAFETY·T (noise on p_j, unequal cluster weights and CL-OMPR's
search leave some centroids short), else ``expected to work``. SAFETY = 3 is measured: in 42
federated runs (21 configurations, two seeds) all 10 with z ≥ 3T were identified by the decoder
(relative SSE 1.03–1.30, median 1.05), 5 of the 15 with T ≤ z < 3T (1.07–4.7, median 1.65), and
none of the 17 with z < T (3.4–53). The decoder's measured z comes out 1.18× the prediction
(1.11–1.34) once signal dominates: its atom search also climbs the noise it lands on.
The noise-to-signal ratio of the whole sketch is ‖e‖/‖s‖ ≈ √(2m·v)/(h·κ̄/√k) = √(2m/k)/z (atoms
of well-separated centroids are nearly orthogonal, so ‖s‖² ≈ Σ p_j² = (h·κ̄)²/k). The decoder
reads the sketch along k atoms, not 2m coordinates, so a sketch whose noise outweighs its signal
can still decode: at m = 1000, k = 10, z = T ≈ 9 is ‖e‖/‖s‖ ≈ 1.6 and z = 3T is 0.5.
Measured: ``benchmarks/bench_planner.py``, ``benchmarks/RESULTS.md`` §10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..dp.plan import noise_plan
from ..features import FIRST_HARMONIC, GRID
from ..sketch.frequencies import draw_frequencies
from ..sketch.privacy import coordinate_variance, term_variance
from ..sketch.spec import SketchSpec
from .study import StudySpec

#: Assumed cluster standard deviation in units of the spec's σ (module docstring).
CLUSTER_SPREAD = 0.5
#: z at or above SAFETY·threshold: decoding expected to work (module docstring, measured).
SAFETY = 3.0
#: E[(Re f)²] = E[(Im f)²] of one record's feature: 1/2 for e^{iθ} over spread phases, exactly 1
#: for the quantized map's ±1 parts.
SQUARED_PART = {"complex": 0.5, "quantized": 1.0}
WORKS, DOUBTFUL, HOPELESS = "expected to work", "doubtful", "hopeless"


def noise_variance(spec: SketchSpec, records: float, draws: float = 1.0) -> float:
    """v of the module docstring (sketch units² per real coordinate) for ``records`` = N
    released and ``draws`` full noise draws; 0 noise draws for a noiseless spec."""
    m, r = spec.frequencies.m, spec.r
    alpha = r / m
    n = max(records, 1.0)
    sampling = (1.0 - alpha) * SQUARED_PART[spec.feature] / (alpha * n * m)
    if spec.privacy.noiseless:
        return sampling
    term = noise_plan(spec.feature, m, r, spec.privacy)[0]
    return draws * coordinate_variance(term, GRID[spec.feature], alpha, n, m) + sampling


def noise_draws(spec: StudySpec, devices: float) -> float:
    """Full noise draws in the sum of ``devices`` releases: one per device, or devices/h_min
    under secure aggregation."""
    if spec.secure_aggregation is None:
        return float(devices)
    return devices / spec.assumptions.min_honest


def atom_weight(spec: SketchSpec, k: int) -> float:
    """p = h·κ̄/k (module docstring): the expected weight of one centroid's unit atom."""
    freqs = draw_frequencies(spec.frequencies)
    spread = CLUSTER_SPREAD * spec.frequencies.scale
    kappa = float(np.mean(np.exp(-0.5 * spread * spread * np.sum(freqs.omega ** 2, axis=0))))
    return FIRST_HARMONIC[spec.feature] * kappa / k


@dataclass(frozen=True)
class Plan:
    """A study's predicted decoding: N records from ``devices`` devices, ``draws`` full noise
    draws, the noise standard deviation √v per real coordinate and the expected atom weight p
    (sketch units), the predicted z = p/√v and the decoder's threshold (noise standard
    deviations), ‖e‖/‖s‖, the verdict, and the records per device at which z would reach
    SAFETY·threshold."""

    devices: int
    records: float
    draws: float
    noise_sd: float
    atom_weight: float
    z: float
    threshold: float
    noise_to_signal: float
    verdict: str
    records_needed: float
    secure: bool

    def summary(self) -> str:
        """One paragraph for an operator."""
        per = self.records / self.devices
        text = (f"planner: {self.devices} devices × {per:,.0f} records: each centroid's atom is "
                f"expected at z ≈ {self.z:.3g} noise standard deviations; the decoder needs z > "
                f"{self.threshold:.3g}, and z ≥ {SAFETY * self.threshold:.3g} is expected to work "
                f"(noise/signal of the whole sketch {self.noise_to_signal:.2g}): {self.verdict}")
        if self.verdict != WORKS:
            other = "" if self.secure or self.devices == 1 else (
                f", or secure aggregation (about one noise draw instead of {self.devices})")
            text += (f". About {self.records_needed:,.0f} records per device would make it expected "
                     f"to work (or a larger ε, fewer clusters{other})")
        return text


def plan_study(spec: StudySpec, records_per_device: float, threshold: float,
               devices: int | None = None) -> Plan:
    """The prediction for ``spec``'s sketch when ``devices`` (default: the quorum) devices hold
    ``records_per_device`` records each; ``threshold`` is the decoder's for the spec's Ω and box
    (:func:`fedsketch.server.decode.identify.noise_ceiling` + MARGIN). ValueError unless
    ``records_per_device`` is finite and > 0."""
    if not (math.isfinite(records_per_device) and records_per_device > 0):
        raise ValueError(f"the expected records per device must be a finite number > 0, got "
                         f"{records_per_device!r}")
    devices = spec.min_devices if devices is None else devices
    sketch, k, m = spec.sketch, spec.k, spec.sketch.frequencies.m
    n = devices * records_per_device
    draws = noise_draws(spec, devices)
    v = noise_variance(sketch, n, draws)
    p = atom_weight(sketch, k)
    z = p / math.sqrt(v)
    verdict = HOPELESS if z < threshold else DOUBTFUL if z < SAFETY * threshold else WORKS
    return Plan(devices, n, draws, math.sqrt(v), p, z, threshold,
                math.sqrt(2 * m * v) / (p * math.sqrt(k)), verdict,
                _records_needed(sketch, p, SAFETY * threshold, draws) / devices,
                spec.secure_aggregation is not None)


def _records_needed(spec: SketchSpec, weight: float, z: float, draws: float) -> float:
    """N in all at which p/√v(N) = z: v(N) = A/N² + B/N = (p/z)², solved for N > 0."""
    target = (weight / z) ** 2
    m, alpha = spec.frequencies.m, spec.r / spec.frequencies.m
    b = (1.0 - alpha) * SQUARED_PART[spec.feature] / (alpha * m)
    a = 0.0
    if not spec.privacy.noiseless:
        term = noise_plan(spec.feature, m, spec.r, spec.privacy)[0]
        a = draws * term_variance(term) / (GRID[spec.feature] * alpha * math.sqrt(m)) ** 2
    return (b + math.sqrt(b * b + 4 * target * a)) / (2 * target)


def residual_noise(spec: StudySpec, residual: float, devices: int, records: float) -> tuple[float, str]:
    """(‖e‖, a sentence): the norm √(2m·v) the noise of a decoded study's aggregate is expected to
    have (its public spec, ``devices`` releases of ``records`` released records in all), and how
    much of the decoder's ``residual`` ‖s − Σ_j p_j·a(c_j)‖ it explains. Both norms are in sketch
    units; noise and the clusters' misfit as atoms add in squared norm, so the noise's share of the
    residual is ‖e‖²/residual² (capped at 1: the fitted atoms also absorb a little noise)."""
    v = noise_variance(spec.sketch, records, noise_draws(spec, devices))
    norm = math.sqrt(2 * spec.sketch.frequencies.m * v)
    if residual <= 0:
        return norm, f"residual {residual:.3g}; the noise is expected to have norm {norm:.3g}"
    share = min(1.0, (norm / residual) ** 2)
    text = (f"residual {residual:.3g} (‖s − fitted atoms‖, sketch units); the noise of {devices} "
            f"releases of {records:,.0f} records is expected to have norm {norm:.3g}, so "
            f"{100 * share:.0f} % of the residual (in squared norm) is noise")
    if share >= 0.9:
        text += ": what the fit leaves is noise"
    elif share < 0.5:
        text += (": most of it is not noise (records unlike k clusters of the spread the scale σ is "
                 "made for, or centroids the decoding missed)")
    return norm, text
