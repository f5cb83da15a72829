"""The noise plan of a sketch release: which noise, on what, at which scale, for which ε.

One function decides the noise of every privacy path; the device's release
(:func:`fedsketch.common.privacy.privatize`), the coordinator's magnitude check
(:func:`fedsketch.common.wire.max_abs_entry`) and secure aggregation (the study's DLap parameter
and each device's noise share) all read it. With α = r/m, c_f from
:mod:`fedsketch.common.features` and S the feature sum over n records:

replace-one (n public), δ = 0 (MECHANISMS §1.1–1.2, §1.5)
    ``complex``:   Lap(b) on each real coordinate of s = S/(α n √m), b = c_f √m/(n ε) (sketch units)
    ``quantized``: DLap(a) on each of the 2m integers of S, a = exp(−ε/(4r))
replace-one, δ > 0 (§1.6): N(0, σ²) on s, σ = analytic-Gaussian(Δ2, ε, δ), Δ2 = g √m/(n √r)
add/remove (n private), δ = 0 (§1.7): ε1 = ε·2m/(2m+1) on the numerator, ε2 = ε − ε1 on n
    ``complex``:   Lap((c_f/2)√m/ε1) on S/(α√m),  Lap(1/ε2) on n
    ``quantized``: DLap(e^{−ε1/(2r)}) on S,        DLap(e^{−ε2}) on n
add/remove, δ > 0: one N(0, σ²) on the joint vector (S/(α√m), n), Δ2 = √((g/2)² m/r + 1)

The sensitivities come from :mod:`fedsketch.common.dp.calibration`, one function each.
"""

from __future__ import annotations

from .budget import NoiseTerm, PrivacySpec, add_remove_split
from .calibration import (
    COUNT_SENSITIVITY,
    complex_l1_sensitivity,
    dlap_param,
    gauss_sigma_analytic,
    gaussian_l2_sensitivity,
    laplace_scale,
    quantized_l1_sensitivity,
)


def integer_sum_term(epsilon: float, r: int, neighbouring: str) -> NoiseTerm:
    """DLap(a) on each integer of the quantized sum S, a = exp(−ε/Δ1), Δ1 = 4r or 2r (§1.5, §1.7).

    Under secure aggregation the aggregate of the devices' shares carries exactly this term
    (replace-one, MECHANISMS §4.2). ε = ∞ gives a = 0 (no noise).
    """
    delta1 = quantized_l1_sensitivity(r, neighbouring)
    return NoiseTerm("integer sum", "discrete_laplace", epsilon, delta1, dlap_param(epsilon, delta1))


def noise_plan(feature: str, m: int, r: int, privacy: PrivacySpec, n: float) -> tuple[NoiseTerm, ...]:
    """The noise terms of a release of m entries, r per record, over n records (module docstring).

    The first term is added to the 2m real coordinates (normalized sketch, integer sum or
    numerator). Under add/remove with δ = 0 a second term is added to the record count; the
    Gaussian's single term covers both. ``n`` only enters the replace-one sensitivities of the
    float releases. ε = ∞ gives terms of scale 0 (:func:`~fedsketch.common.privacy.privatize`
    releases those without any term).
    """
    eps, relation = privacy.epsilon, privacy.neighbouring
    if privacy.delta > 0:
        delta2 = gaussian_l2_sensitivity(feature, m, r, n, relation)
        target = "normalized sketch" if relation == "replace_one" else "(numerator, record count)"
        return (NoiseTerm(target, "gaussian", eps, delta2, gauss_sigma_analytic(delta2, eps, privacy.delta)),)
    if relation == "replace_one":
        if feature == "quantized":
            return (integer_sum_term(eps, r, relation),)
        delta1 = complex_l1_sensitivity(m, n, relation)
        return (NoiseTerm("normalized sketch", "laplace", eps, delta1, laplace_scale(delta1, eps)),)
    eps1, eps2 = add_remove_split(eps, m)
    if feature == "quantized":
        return (integer_sum_term(eps1, r, relation),
                NoiseTerm("record count", "discrete_laplace", eps2, COUNT_SENSITIVITY,
                          dlap_param(eps2, COUNT_SENSITIVITY)))
    delta1 = complex_l1_sensitivity(m, n, relation)
    return (NoiseTerm("numerator (1/α)Σ z⊙b", "laplace", eps1, delta1, laplace_scale(delta1, eps1)),
            NoiseTerm("record count", "laplace", eps2, COUNT_SENSITIVITY,
                      laplace_scale(COUNT_SENSITIVITY, eps2)))
