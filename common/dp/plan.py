"""The noise plan of a sketch release: which noise, on which integers, at which scale, for which ε.

One function decides the noise of every privacy path; the device's release
(:func:`fedsketch.common.sketch.privacy.privatize`), the coordinator's magnitude check
(:func:`fedsketch.common.study.wire.max_abs_entry`) and secure aggregation (the study's DLap parameter
and each device's noise share) all read it. Every release is an integer vector (MECHANISMS §1.9
item 7, §1.10): the encoded sum S ∈ Z^{2m} in grid steps (:mod:`fedsketch.common.sketch.sketching`) and,
under add/remove, the record count n ∈ Z. Every term is an integer law, drawn exactly
(:mod:`fedsketch.common.dp.samplers`). With Δ1, Δ2 the sensitivities of S in grid steps
(:func:`~fedsketch.common.dp.calibration.l1_sensitivity`, :func:`~.calibration.l2_sensitivity`):

replace-one (n public), δ = 0:  DLap(a) on each of the 2m integers of S, a = exp(−ε/Δ1), Δ1 = 2rκ
replace-one, δ > 0:             N_Z(0, σ²) on S, σ = :func:`~.calibration.dgauss_sigma`(Δ2, ε, δ)
add/remove (n private): ε1 = ε·2m/(2m+1) on S as above (Δ1 = rκ, Δ2 = √r·L), with (ε1, δ);
                        DLap(e^{−ε2}) on n, ε2 = ε − ε1 (sensitivity 1), always pure.
The ε of the terms add up to the spec's ε; δ is spent by the one Gaussian term.
"""

from __future__ import annotations

from functools import lru_cache

from .budget import NoiseTerm, PrivacySpec, add_remove_split
from .calibration import COUNT_SENSITIVITY, dgauss_sigma, dlap_param, l1_sensitivity, l2_sensitivity


def integer_sum_term(feature: str, epsilon: float, r: int, neighbouring: str,
                     delta: float = 0.0) -> NoiseTerm:
    """The noise on the 2m integers of S: DLap(a), a = exp(−ε/Δ1) (δ = 0), or N_Z(0, σ²) (δ > 0).

    Under secure aggregation the aggregate of the devices' shares carries exactly the δ = 0 term
    (replace-one, MECHANISMS §4.2). ε = ∞ gives scale 0 (no noise).
    """
    if delta > 0:
        delta2 = l2_sensitivity(feature, r, neighbouring)
        return NoiseTerm("integer sum", "discrete_gaussian", epsilon, delta2,
                         dgauss_sigma(delta2, epsilon, delta))
    delta1 = l1_sensitivity(feature, r, neighbouring)
    return NoiseTerm("integer sum", "discrete_laplace", epsilon, delta1, dlap_param(epsilon, delta1))


def count_term(epsilon: float) -> NoiseTerm:
    """DLap(e^{−ε}) on the record count (add/remove, sensitivity 1)."""
    return NoiseTerm("record count", "discrete_laplace", epsilon, COUNT_SENSITIVITY,
                     dlap_param(epsilon, COUNT_SENSITIVITY))


@lru_cache(maxsize=256)
def noise_plan(feature: str, m: int, r: int, privacy: PrivacySpec) -> tuple[NoiseTerm, ...]:
    """The noise terms of a release of m entries, r per record (module docstring).

    The first term is added to the 2m integers of S; under add/remove the second is added to the
    record count. Cached: the coordinator checks every contribution against its study's plan,
    and the discrete Gaussian's calibration costs milliseconds.
    """
    eps, relation = privacy.epsilon, privacy.neighbouring
    if relation == "replace_one":
        return (integer_sum_term(feature, eps, r, relation, privacy.delta),)
    eps1, eps2 = add_remove_split(eps, m)
    return (integer_sum_term(feature, eps1, r, relation, privacy.delta), count_term(eps2))
