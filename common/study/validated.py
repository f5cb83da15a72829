"""A secure study validated by two aggregators (``validation: "helper"``, docs/bounded-influence.md):
the public bounds of one device's input, its bounded noise share, and the δ that bound costs.

**The input.** Round 0's release under secure aggregation is x + e: x the device's exact
integer feature sum (2m entries, grid steps), e its noise share. Every record moves each part of
an entry by at most γ = GRID[feature] and an entry by at most κ = ENTRY_L1 in |Re| + |Im|, over r
entries; so an honest device of n registered records has |x_i| ≤ γ·n and ‖x‖₁ ≤ r·κ·n.

**The noise share** e = X − X', X and X' of NB(1/h_min, a) per entry (shares of h_min devices
add up to DLap(a)). NB(1/h_min) is stochastically below a geometric NB(1), so P(|e_i| > t) ≤
2·a^{t+1}, and t_e is the least t with 2m·2a^{t+1} ≤ 2^−40 (:func:`noise_radius` at shape 1 with
the tail halved); ‖e‖₁ ≤ Σ(X_i + X'_i), one NB(4m/h_min, a), has the L1 radius t₁ at 2^−40.
An honest device's share lies within both except with probability p_out ≤ 2^−39; the device
**redraws** it until it does (:func:`bounded_noise_share`). The redrawn share's law is the exact
one conditioned on an event of probability ≥ 1 − 2^−39, within 2^−39 of it in total variation;
the released sum is a function of the roster's L shares, so its law is within η = L·2^−39 of
the exact mechanism's in total variation. That costs more than η: if P, P' are within η of Q,
Q' and Q ≤ e^ε·Q' on every event S (the exact mechanism's ε-DP, ε the release's), then
P(S) ≤ Q(S) + η ≤ e^ε·Q'(S) + η ≤ e^ε·(P'(S) + η) + η, so every ε-DP statement of the study
holds as (ε, δ) with δ = (1 + e^ε)·L·2^−39 (:func:`validity_delta`), which each device records
with its spend and the coordinator counts against the device's declared budget.

**The circuit** of a device with n records (:func:`device_circuit`): 2m entries within
B = γ·n + t_e, and, when the field can hold it, ‖x + e‖₁ ≤ B₁ = r·κ·n + t₁. The whole study's
sum must read back from F_p: γ·max_records + the summed noise's radius < p/2
(:func:`check_validated`, at creation). Refinement rounds and round 0's calibration are not
validated yet: such a study is refused.
"""

from __future__ import annotations

import math

import numpy as np

from ..dp.calibration import LOG_TAIL, noise_radius
from ..dp.plan import integer_sum_term
from ..dp.samplers import dlap_noise_share
from ..features import ENTRY_L1, GRID
from ..validity.circuit import RangeCircuit
from ..validity.field import P
from .study import StudySpec

#: The tail each of the two radii leaves: 2^−40.
TAIL = LOG_TAIL


def is_validated(spec) -> bool:
    sa = getattr(spec, "secure_aggregation", None)
    return sa is not None and sa.validation == "helper"


def share_radii(spec: StudySpec) -> tuple[int, int]:
    """(t_e, t₁): the per-entry and L1 radii of one device's noise share (module docstring)."""
    dim, a = 2 * spec.sketch.frequencies.m, spec.noise_param()
    per_entry = noise_radius(a, dim, 1.0, log_tail=TAIL - math.log(2.0))
    l1 = noise_radius(a, 1, shape=max(1.0, 2 * dim / spec.assumptions.min_honest))
    return per_entry, l1


def validity_delta(spec: StudySpec) -> float:
    """δ = (1 + e^ε)·L·2^−39 that the bounded noise shares cost the release, ε the sketch's
    (module docstring), at most 1 (any release is (ε, 1)-DP: reached from ε ≈ 24 at L = 20)."""
    epsilon = spec.sketch.privacy.epsilon
    if epsilon > 64.0:  # e^ε overflows later; δ is 1 long before
        return 1.0
    return min(1.0, (1.0 + math.exp(epsilon)) * spec.min_devices * 2.0 ** -39)


def bounded_noise_share(spec: StudySpec) -> np.ndarray:
    """A noise share within both radii (redrawn until it is: module docstring)."""
    term = integer_sum_term(spec.sketch.feature, spec.sketch.privacy.epsilon, spec.sketch.r,
                            "replace_one")
    t_e, t_1 = share_radii(spec)
    while True:
        e = dlap_noise_share(term.epsilon, term.sensitivity, spec.assumptions.min_honest,
                             2 * spec.sketch.frequencies.m)
        if int(np.abs(e).max(initial=0)) <= t_e and int(np.abs(e).sum()) <= t_1:
            return e


def device_circuit(spec: StudySpec, n: int) -> tuple[int, int, int]:
    """(entries, B, B₁ or 0) of a device with ``n`` registered records: the L1 bound is used
    where it is sharper than 2m·B and the field holds its witness (else 0, none)."""
    t_e, t_1 = share_radii(spec)
    entries = 2 * spec.sketch.frequencies.m
    bound = GRID[spec.sketch.feature] * n + t_e
    l1 = spec.sketch.r * ENTRY_L1[spec.sketch.feature] * n + t_1
    if l1 >= entries * bound:
        return entries, bound, 0
    try:
        RangeCircuit(entries, bound, l1)
    except ValueError:
        return entries, bound, 0
    return entries, bound, l1


def check_validated(spec: StudySpec, served: bool = True) -> None:
    """ValueError unless a validated study's every device circuit and its sum fit F_p, and its
    coordinator can reach a helper (``served``: started with --helper-token-file, not --shared);
    nothing for a study not validated."""
    if not is_validated(spec):
        return
    if not served:
        raise ValueError("a study validated by a helper needs a coordinator started with "
                         "--helper-token-file (and not --shared)")
    if spec.refine is not None or spec.calibration is not None or spec.box is not None:
        raise ValueError("a study validated by a helper runs round 0's sketch only: refinement "
                         "rounds, --scale auto and --bounds auto are not validated yet")
    sa = spec.secure_aggregation
    try:
        RangeCircuit(2 * spec.sketch.frequencies.m, device_circuit(spec, spec.device_cap)[1])
    except ValueError as exc:
        raise ValueError(f"validation: one device's bound does not fit the field: {exc}") from None
    shape = spec.min_devices / spec.assumptions.min_honest
    total = GRID[spec.sketch.feature] * sa.max_records + noise_radius(
        spec.noise_param(), 2 * spec.sketch.frequencies.m, shape=shape)
    if 2 * total >= P:
        raise ValueError(f"validation: the study's sum can reach {total:,} grid steps, beyond "
                         f"what F_p (p = 2^31 - 1) reads back ({P // 2:,}); lower max_records")
