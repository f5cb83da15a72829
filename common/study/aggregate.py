"""The second line of defence: the aggregate checked against what honest devices can sum to.

Under secure aggregation the coordinator sees only Σ_{u∈Y}(S_u + e_u) over the devices Y whose
masked input arrived, never one input, so nothing bounds what one device encoded
(docs/bounded-influence.md). What can be checked is the sum: every honest device u holds at most
its registered n_u ≤ ``max_device_records`` records, each record moves one part (Re or Im) of an
entry of the encoded sum by at most γ grid steps (:data:`fedsketch.common.features.GRID`), so the
clean sum has |Σ_u S_u| ≤ γ·N per part, N = Σ_{u∈Y} n_u. The noise shares of |Y| devices, each
NB(1/h_min, a) − NB(1/h_min, a), add up to Z = NB(ρ, a) − NB(ρ, a), ρ = |Y|/h_min, and
:func:`~fedsketch.common.dp.calibration.noise_radius` gives the t with 2m·P(|Z| > t) ≤ 2^−40. So an
honest round has every entry within γ·N + t except with probability below 2^−40: a false alarm
fails an honest study about once in 10^12. A record touches r of the m entries, each by at most
κ = ENTRY_L1 in |Re| + |Im|, so also ‖Σ_u S_u‖₁ ≤ r·κ·N, and the noise's L1 norm is at most one
NB(4mρ, a) draw (:func:`l1_slack`), bounded at 2^−40 too: with r ≪ m this is the sharp check
(one entry alone may hold up to γ·N, the L1 norm grows only by r·κ per record). A sum beyond
either bound proves that some input was outside its range; the study fails without publishing
(:class:`AggregateError`, whose message starts with :data:`VIOLATION`). The check bounds a
hostile device's influence only to what the slack leaves, r·κ·N − ‖Σ_honest S_u‖₁ plus the noise
radius in L1: honest sums of spread-out records cancel (phases of different records point in
different directions), so that is most of r·κ·N. A reviewer's one hostile device of 20 passed
with its records at a decoy point weighted 23× and took 75 % of the decoded weight; the per-input
proof of docs/bounded-influence.md closes that.

Plain studies: every device released its own full noise draw, so K releases carry K draws: for
DLap(a) their sum is NB(K, a) − NB(K, a) (ρ = K above); for the discrete Gaussian N_Z(0, σ²), each
σ²-subgaussian (Canonne–Kamath–Steinke 2020), the sum is Kσ²-subgaussian and
t = σ·√(2K·ln(2·2m·2^40)). Under add/remove the true N is at most Σ n~ plus the radius of the
counts' summed DLap(e^{−ε2}) terms (ρ = K, one coordinate), and at most K·cap.

Refinement rounds (:mod:`fedsketch.common.study.refine`): the K cell counts C_j and K·d sums T_jl.
With r_c, r_s the radii of the counts' and sums' summed noise (ρ as above, K and K·d coordinates)
and r_Σ that of Σ_j C_j's noise (ρ·K shares on one coordinate): −r_c ≤ C_j ≤ N + r_c,
|Σ_j C_j − N| ≤ r_Σ when N is known (the secure round's declared records), and
|T_jl| ≤ STEPS·min(max(C_j + r_c, 0), N) + r_s (cell j holds at most C_j + r_c records of at most
STEPS steps each). Each family is bounded at 2^−40; the round's false alarm is below 3·2^−40.
"""

from __future__ import annotations

import math

import numpy as np

from ..dp.calibration import LOG_TAIL, dlap_param, noise_radius
from ..dp.grid import STEPS
from ..dp.plan import integer_sum_term, noise_plan
from ..features import ENTRY_L1, GRID
from .refine import RoundSpec
from .study import StudySpec

#: How every violation's message begins (a failed round's detail is recognised by it).
VIOLATION = "the aggregate is out of range"


class AggregateError(ValueError):
    """An aggregate entry beyond what honest devices can sum to (module docstring)."""


def _worst(values: np.ndarray) -> int:
    """max |v| as a Python int (np.abs would wrap −2^63)."""
    values = np.asarray(values, dtype=np.int64)
    return max(int(values.max()), -int(values.min())) if values.size else 0


def gauss_radius(sigma: float, draws: int, dim: int) -> int:
    """t with dim·P(|Z| > t) ≤ 2^−40 for Z a sum of ``draws`` σ²-subgaussian draws:
    P(|Z| > t) ≤ 2·exp(−t²/(2·draws·σ²)), so t = σ·√(2·draws·(ln(2·dim) − ln 2^−40))."""
    return math.ceil(sigma * math.sqrt(2.0 * draws * (math.log(2.0 * dim) - LOG_TAIL)))


def sketch_slack(spec: StudySpec, devices: int, secure: bool) -> int:
    """The summed noise's radius t on each of the 2m entries (grid steps; module docstring):
    ``devices`` noise shares of shape 1/h_min (``secure``) or full draws (plain)."""
    dim = 2 * spec.sketch.frequencies.m
    if secure:
        return noise_radius(spec.noise_param(), dim, shape=devices / spec.assumptions.min_honest)
    privacy = spec.sketch.privacy
    if privacy.noiseless:
        return 0
    term = noise_plan(spec.sketch.feature, spec.sketch.frequencies.m, spec.sketch.r, privacy)[0]
    if term.law == "discrete_laplace":
        return noise_radius(term.scale, dim, shape=float(devices))
    return gauss_radius(term.scale, devices, dim)


def true_records(spec: StudySpec, records: float, devices: int, secure: bool) -> int:
    """The most records ``devices`` honest devices can hold given the ``records`` they declared
    (exact under replace-one and secure aggregation; noisy counts under add/remove)."""
    bound = devices * spec.device_cap
    if secure or spec.sketch.privacy.neighbouring == "replace_one":
        return min(int(records), bound)
    privacy = spec.sketch.privacy
    count = noise_plan(spec.sketch.feature, spec.sketch.frequencies.m, spec.sketch.r, privacy)[1]
    return min(max(int(records), 0) + noise_radius(count.scale, 1, shape=float(devices)), bound)


def l1_slack(spec: StudySpec, devices: int, secure: bool) -> int | None:
    """The summed noise's L1 radius over the 2m entries (grid steps), None where it is not
    bounded here (the plain discrete Gaussian: its per-entry bound stands alone). |Z_i| ≤ X_i +
    X'_i with X, X' the two NB(ρ, a) of Z_i = X_i − X'_i, and the 2·2m of them add up to one
    NB(4mρ, a): its tail is :func:`noise_radius`'s (one coordinate, shape 4mρ)."""
    dim = 2 * spec.sketch.frequencies.m
    if secure:
        a, shape = spec.noise_param(), devices / spec.assumptions.min_honest
    elif spec.sketch.privacy.noiseless:
        return 0
    else:
        term = noise_plan(spec.sketch.feature, spec.sketch.frequencies.m, spec.sketch.r,
                          spec.sketch.privacy)[0]
        if term.law != "discrete_laplace":
            return None
        a, shape = term.scale, float(devices)
    return noise_radius(a, 1, shape=2 * dim * shape)


def sketch_bound(spec: StudySpec, records: float, devices: int, secure: bool) -> int:
    """γ·N + t: the largest |entry| (grid steps) of an honest aggregate (module docstring)."""
    clean = GRID[spec.sketch.feature] * true_records(spec, records, devices, secure)
    return clean + sketch_slack(spec, devices, secure)


def check_sketch_sum(spec: StudySpec, total: np.ndarray, records: float, devices: int,
                     secure: bool) -> None:
    """AggregateError unless every entry of the summed sketch ``total`` (2m or (2, m) int64)
    lies within :func:`sketch_bound`."""
    kind = "secure sum" if secure else "sum"
    bound, worst = sketch_bound(spec, records, devices, secure), _worst(total)
    slack = l1_slack(spec, devices, secure)
    if slack is not None:
        r_kappa = spec.sketch.r * ENTRY_L1[spec.sketch.feature]
        l1_bound = r_kappa * true_records(spec, records, devices, secure) + slack
        l1 = int(np.abs(np.asarray(total, dtype=np.int64).astype(np.float64)).sum())
        if l1 > l1_bound:
            raise AggregateError(
                f"{VIOLATION}: the {kind} of {devices} devices has an L1 norm of {l1:,} grid "
                f"steps, beyond {l1_bound:,}, the most {records:,.0f} registered records (r·κ = "
                f"{r_kappa:,} steps each) and the noise (L1 radius {slack:,}, exceeded with "
                "probability below 2^-40) can sum to: some device's input was outside its "
                "range; nothing is published")
    if worst > bound:
        raise AggregateError(
            f"{VIOLATION}: an entry of the {kind} of {devices} devices is {worst:,} grid steps, "
            f"beyond {bound:,}, the most {records:,.0f} registered records (γ = "
            f"{GRID[spec.sketch.feature]} steps each) and the noise (radius "
            f"{sketch_slack(spec, devices, secure):,}, exceeded with probability below 2^-40) "
            "can sum to: some device's input was outside its range; nothing is published")


def check_calibration_sum(spec: StudySpec, total: np.ndarray, records: float,
                          devices: int) -> None:
    """AggregateError unless a secure round 0's sum (2·m0 entries, complex map, γ = GRID) lies
    within γ·N + t, t the radius of its DLap shares (shape devices/h_min)."""
    cal = spec.calibration
    scale = integer_sum_term("complex", cal.epsilon, cal.m0, "replace_one").scale
    slack = noise_radius(scale, 2 * cal.m0, shape=devices / spec.assumptions.min_honest)
    bound, worst = GRID["complex"] * int(records) + slack, _worst(total)
    if worst > bound:
        raise AggregateError(
            f"{VIOLATION}: an entry of round 0's secure sum of {devices} devices is {worst:,} "
            f"grid steps, beyond {bound:,}, the most {records:,.0f} registered records and the "
            f"noise (radius {slack:,}) can sum to; nothing is published")


def cells_radii(parent: StudySpec, rnd: RoundSpec, shape: float) -> tuple[int, int, int]:
    """(r_c, r_s, r_Σ) of a round's summed noise of shape ``shape`` (module docstring)."""
    k, d = rnd.shape
    eps_count, eps_dim = rnd.split(parent)
    a_count, a_sum = dlap_param(eps_count, 1.0), dlap_param(eps_dim, float(STEPS))
    return (noise_radius(a_count, k, shape), noise_radius(a_sum, k * d, shape),
            noise_radius(a_count, 1, shape * k))


def check_cells_sum(parent: StudySpec, rnd: RoundSpec, counts: np.ndarray, sums: np.ndarray,
                    records: float, devices: int, secure: bool) -> None:
    """AggregateError unless a round's summed cells (counts (K,), sums (K, d)) lie within what
    ``devices`` honest devices with ``records`` records in all can release (module docstring;
    plain rounds: ``records`` is Σ_j C_j itself, so only the per-cell bounds apply, with N at
    most Σ n + r_Σ and devices × cap)."""
    shape = devices / parent.assumptions.min_honest if secure else float(devices)
    r_count, r_sum, r_total = cells_radii(parent, rnd, shape)
    n_max = min(int(records) + (0 if secure else r_total), devices * parent.device_cap)
    counts = np.asarray(counts, dtype=np.int64)
    sums = np.asarray(sums, dtype=np.int64)
    where = f"{VIOLATION}: refinement round {rnd.round}'s {'secure ' if secure else ''}sum of " \
            f"{devices} devices"
    low, high = int(counts.min()), int(counts.max())
    if low < -r_count or high > n_max + r_count:
        raise AggregateError(f"{where} has a cell count of {low if low < -r_count else high:,}, "
                             f"outside {-r_count:,} .. {n_max + r_count:,} ({n_max:,} records and "
                             f"the counts' noise radius {r_count:,}); nothing is published")
    total = sum(int(c) for c in counts)
    if secure and abs(total - int(records)) > r_total:
        raise AggregateError(f"{where} counts {total:,} records in its cells, not the "
                             f"{records:,.0f} registered within the noise radius {r_total:,}; "
                             "nothing is published")
    for j in range(counts.size):
        bound = STEPS * min(max(int(counts[j]) + r_count, 0), n_max) + r_sum
        worst = _worst(sums[j])
        if worst > bound:
            raise AggregateError(f"{where} has a sum of {worst:,} steps in cell {j}, beyond "
                                 f"{bound:,}, the most its count and the noise (radius {r_sum:,}) "
                                 "allow; nothing is published")
