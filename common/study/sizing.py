"""How large a sketch a table can carry: m from public quantities, and whether the sketch is worth
its share of ε at all.

Inputs are public: N records (released, or expected in a study), the dimension d, k clusters, the
sketch's ε, the neighbouring relation and the feature map. Units follow :mod:`.planner`: the
normalized sketch is dimensionless and z counts noise standard deviations per real coordinate.

**Why not a fixed m.** The planner's prediction for one centroid's atom is z = h·κ̄/(k·√v(m)),
with v(m) ≈ 8κ²m/(γN·ε)² + (1 − α)q/(αN·m) (privacy noise and the subsampling of r = 1 of the m
entries). The privacy term grows as m: once it dominates, z falls as 1/√m, so a larger sketch
only buries the same signal deeper (and costs O(m·d·k) per decoder evaluation). CL-OMPR on the
other hand needs m of the order of k·d measurements to identify k·(d + 1) parameters (paper 004
uses m = 10kd and 100kd). The plan therefore tries m = f·k·d for f in M_PER_KD_STEPS (largest
first) and takes

* the largest m whose z clears T (the decoder can tell a centroid of average weight from noise;
  the sizes the real-data benchmarks were tuned at, m = 10kd, stay wherever they clear it), else
* the m of largest z (the smallest tried, where privacy noise dominates), flagged not ``useful``.

(The front ends' :func:`default_size` takes 10·k·d within its work bound instead in that second
case: a start below T still seeds Lloyd steps or rounds, and the smallest sizes seeded them worse
on baseball, RESULTS.md §13–§14.)

T is the decoder's identification threshold (:mod:`fedsketch.server.decode.identify`: what noise
alone gives an atom in the box, plus 3). Computing it takes pure-noise searches on the actual Ω;
the plan uses T(d) = THRESHOLD_BASE + THRESHOLD_SLOPE·√d, fitted to the thresholds measured in
``benchmarks/RESULTS.md`` §7 (6.8–9.5 at d = 5–7, 17.6–17.8 at d = 64), since the maximum of
noise over atoms grows with the number of distinguishable atoms in the box, roughly as √d.

A noiseless sketch (ε = ∞) has z = ∞ at every m; it takes M_PER_KD_STEPS[0]·k·d, unless a
``max_work`` bound on m·d·k is given (the decoder's cost per evaluation, for callers that only
need a start, such as ``ckm-lloyd``, whose centroids come from Lloyd steps after it); m never
falls below k·d.

**The front ends' default** (:func:`default_size`: ``CompressiveKMeans``, ``fedsketch sketch
--k``, ``coordinator create-study``, ``simulate``, whenever m is not given): the plan above at the
sketch's own ε (what σ's calibration, a private box and refinement rounds leave it), but 10kd
where no size clears T (the largest z kept as ``best_z``), its work m·d·k capped at
DEFAULT_MAX_WORK. CL-OMPR costs O(m·d·k) per evaluation: digits (d = 64, k = 10)
decoded for 231–262 s at m = 10kd = 6,400 and 4–7 s at m = k·d = 640 (``benchmarks/RESULTS.md``
§13); every d·k ≤ 200 keeps m = 10kd unless a smaller size clears T where 10kd does not (paper
004's mixture, d = k = 10: m = 1,000, the old default). The record count N is public under replace-one;
under add/remove it is private, so the plan reads a noisy count at PLAN_COUNT_SHARE of ε (the
rest goes to the sketch) unless the caller states the records it expects.

Measured (``benchmarks/RESULTS.md`` §13): digits (N = 1,797, d = 64, k = 10) at the ε CKM gets
inside ``ckm-lloyd`` (0.18 at ε = 1): z ≤ 0.5 at every m against T ≈ 17.7, so no sketch of any size
can start Lloyd there, and the sketch's share is better spent on the Lloyd steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..choices import BLIND_ROUND_SHARE, ROUND_SECONDS, ROUND_SHARE
from ..dp.samplers import dlap_noise
from ..sketch.frequencies import FrequencySpec
from ..sketch.privacy import PrivacySpec
from ..sketch.spec import SketchSpec
from .planner import SAFETY, atom_weight, noise_variance
from .refine import RefineSpec, split_study_epsilon

#: m = f·k·d for these f, largest first (paper 004's m = 10kd is the largest).
M_PER_KD_STEPS = (10, 5, 2, 1)
#: T(d) = THRESHOLD_BASE + THRESHOLD_SLOPE·√d (noise standard deviations; module docstring).
THRESHOLD_BASE = 5.15
THRESHOLD_SLOPE = 1.57
#: The front ends' bound on the decoder's work m·d·k per evaluation (module docstring): digits'
#: d·k = 640 gets m = 640 (4–7 s for a non-private fit instead of 231–262 s at 6,400).
DEFAULT_MAX_WORK = 4e5
#: A sketch whose predicted z is below this fraction of T shows no centroid at all: ``ckm-lloyd``
#: skips such a start, and a study gives such a sketch BLIND_ROUND_SHARE's rest only.
BLIND_FRACTION = 1.0 / 3.0
#: Share of ε a plan under add/remove spends on the noisy record count it is made from, when the
#: caller states no expected count (sensitivity 1; the plan needs only the count's order).
PLAN_COUNT_SHARE = 0.02


def threshold_estimate(d: int) -> float:
    """The decoder's identification threshold T at dimension d, estimated (module docstring)."""
    return THRESHOLD_BASE + THRESHOLD_SLOPE * math.sqrt(d)


@dataclass(frozen=True)
class SketchSize:
    """A planned sketch: m frequencies, r = 1 entry per record (r = m at ε = ∞), the predicted z
    of one centroid's atom and the threshold T it is compared with (noise standard deviations),
    whether the sketch is expected to carry any centroid (z ≥ T), and the reason in words."""

    m: int
    r: int
    z: float
    threshold: float
    useful: bool
    reason: str
    best_z: float | None = None  # the largest z of any size tried, where m is not that size

    def to_dict(self) -> dict:
        """JSON-ready form (z "inf" without noise, None when there was no count to predict it)."""
        z = self.z if math.isfinite(self.z) else None if math.isnan(self.z) else "inf"
        return {"m": self.m, "r": self.r, "z": z, "best_z": self.best_z, "threshold": self.threshold,
                "useful": self.useful, "reason": self.reason}


def predicted_z(records: float, d: int, k: int, m: int, epsilon: float,
                neighbouring: str = "replace_one", feature: str = "complex") -> float:
    """The planner's z (:mod:`.planner`) of one centroid's atom for an r = 1 sketch of m
    frequencies over ``records`` records at ``epsilon`` (math.inf: no noise, z = ∞)."""
    if math.isinf(epsilon):
        return math.inf
    spec = SketchSpec(FrequencySpec(d=d, m=m, scale=1.0, seed=0), feature, 1,
                      PrivacySpec(epsilon, 0.0, neighbouring))
    return atom_weight(spec, k) / math.sqrt(noise_variance(spec, records))


def plan_sketch_size(records: float, d: int, k: int, epsilon: float, *,
                     neighbouring: str = "replace_one", feature: str = "complex",
                     max_work: float | None = None) -> SketchSize:
    """m for ``records`` records in d dimensions, k clusters, the sketch's ``epsilon`` (module
    docstring); ``max_work``: an upper bound on m·d·k. ValueError on non-positive inputs."""
    if not (records > 0 and d >= 1 and k >= 1 and epsilon > 0):
        raise ValueError(f"records, d, k and ε must be positive, got {records}, {d}, {k}, {epsilon}")
    threshold = threshold_estimate(d)
    cap = math.inf if max_work is None else max(float(k * d), max_work / (d * k))
    sizes = [f * k * d for f in M_PER_KD_STEPS if f * k * d <= cap] or [k * d]
    if math.isinf(epsilon):
        return SketchSize(sizes[0], sizes[0], math.inf, threshold, True,
                          f"no noise: m = {sizes[0]} ({sizes[0] // (k * d)}·k·d)")
    zs = [predicted_z(records, d, k, m, epsilon, neighbouring, feature) for m in sizes]
    works = [(m, z) for m, z in zip(sizes, zs, strict=True) if z >= threshold]
    m, z = works[0] if works else max(zip(sizes, zs, strict=True), key=lambda p: p[1])
    useful = bool(works)
    if useful:
        reason = (f"z ≈ {z:.3g} at m = {m} clears T ≈ {threshold:.3g}"
                  + ("" if z >= SAFETY * threshold else f" (below {SAFETY:g}·T: doubtful)"))
    else:
        reason = (f"z ≈ {z:.3g} at m = {m}, the best of m = {sizes}, below T ≈ {threshold:.3g}: "
                  f"{records:,.0f} records at ε = {epsilon:.3g} cannot carry {k} centroids in "
                  f"d = {d} through a sketch")
    return SketchSize(m, 1, z, threshold, useful, reason)


def planning_count(n: int, epsilon: float, neighbouring: str,
                   expected: float | None = None) -> tuple[float, float]:
    """(N, ε spent on it): the record count a plan is made from. ``expected`` (the caller's public
    statement) when given; n itself under replace-one or at ε = ∞ (public, or nothing to
    protect); else max(n + DLap(ε_c), 1) at ε_c = PLAN_COUNT_SHARE·``epsilon`` (add/remove,
    sensitivity 1, an exact integer release)."""
    if expected is not None:
        if not (math.isfinite(expected) and expected > 0):
            raise ValueError(f"the expected record count must be a finite number > 0, got {expected!r}")
        return float(expected), 0.0
    if neighbouring == "replace_one" or math.isinf(epsilon):
        return float(n), 0.0
    eps = PLAN_COUNT_SHARE * epsilon
    return float(max(n + int(dlap_noise(eps, 1.0, 1)[0]), 1)), eps


def default_size(records: float, d: int, k: int, sketch_epsilon: float, *,
                 neighbouring: str = "replace_one", feature: str = "complex",
                 devices: int = 1) -> SketchSize:
    """The front ends' m (module docstring): :func:`plan_sketch_size` at the sketch's own ε, its
    work m·d·k at most DEFAULT_MAX_WORK. ``devices`` > 1: a plain federated study, whose sum
    carries one noise draw per device (variance ``devices`` times one draw's), planned as one
    draw at ε/√devices."""
    eps = sketch_epsilon / math.sqrt(devices) if math.isfinite(sketch_epsilon) else sketch_epsilon
    size = plan_sketch_size(records, d, k, eps, neighbouring=neighbouring, feature=feature,
                            max_work=DEFAULT_MAX_WORK)
    if size.useful:
        return size
    m = plan_sketch_size(records, d, k, math.inf, max_work=DEFAULT_MAX_WORK).m
    z = predicted_z(records, d, k, m, eps, neighbouring, feature)
    return SketchSize(m, 1, z, size.threshold, False,
                      f"z ≈ {z:.3g} at m = {m} (at most {size.z:.3g} at any size) below T ≈ "
                      f"{size.threshold:.3g}: {records:,.0f} records at ε = {eps:.3g} cannot carry {k} "
                      f"centroids in d = {d} through a sketch; m = 10·k·d within the work bound, "
                      f"the decoder's own size (a start below T still seeds the rounds)", size.z)


def size_for_sketch(n: int, d: int, k: int, epsilon: float, *, neighbouring: str = "replace_one",
                    feature: str = "complex", reads: float = 0.0) -> tuple[float, SketchSize]:
    """(the ε left for the sketch run, its planned size) for one dataset's sketch of n records
    (``fedsketch sketch --k``, ``fedsketch.sketch(k=)``, ``CompressiveKMeans``): the count of
    :func:`planning_count` (which spends ε under add/remove), then :func:`default_size` at the ε
    the sketch itself keeps after the shares ``reads`` (σ's calibration, a private box) of the
    rest. ValueError for ε ≤ 0 or k < 1."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    if k < 1:
        raise ValueError(f"k (the clusters the sketch is planned for) must be ≥ 1, got {k}")
    records, spent = planning_count(n, epsilon, neighbouring)
    rest = epsilon - spent
    main = rest * (1.0 - reads) if math.isfinite(rest) else rest
    return rest, default_size(records, d, k, main, neighbouring=neighbouring, feature=feature)


def study_size(records_per_device: float | None, devices: int, d: int, k: int, sketch_epsilon: float, *,
               neighbouring: str = "replace_one", feature: str = "complex",
               secure: bool = False) -> SketchSize:
    """A federated study's m (``coordinator create-study``, ``simulate``) when not given: planned
    by :func:`default_size` for ``devices`` devices of ``records_per_device`` records (the
    operator's public expectation) at the sketch's ε (after round 0 and the rounds), one noise
    draw in all under secure aggregation, one per device in a plain study. Without an expectation
    there is no count to plan from: m = 10·k·d (paper 004) within the work bound, flagged."""
    if records_per_device is not None:
        return default_size(records_per_device * devices, d, k, sketch_epsilon, neighbouring=neighbouring,
                            feature=feature, devices=1 if secure else devices)
    size = plan_sketch_size(1.0, d, k, math.inf, max_work=DEFAULT_MAX_WORK)
    return SketchSize(size.m, 1, math.nan, size.threshold, False,
                      f"m = {size.m} from d and k alone (no expected record count to plan it from: "
                      f"give --expected-records)")


def blind(size: SketchSize) -> bool:
    """Whether the planned sketch shows no centroid at all, at any size (z < BLIND_FRACTION·T;
    False when no count was there to predict z)."""
    return (size.z if size.best_z is None else size.best_z) < BLIND_FRACTION * size.threshold


@dataclass(frozen=True)
class StudyPlan:
    """A study's sketch ε and refinement rounds (``refine`` None without rounds), its m, the
    plan of m (None when the operator gave m and a share), and the rounds' share used."""

    sketch_epsilon: float
    refine: RefineSpec | None
    m: int
    size: SketchSize | None
    round_share: float


def plan_study(epsilon: float, rounds: int, records_per_device: float | None, devices: int, d: int,
               k: int, *, m: int | None = None, round_share: float | None = None,
               round_seconds: float = ROUND_SECONDS, neighbouring: str = "replace_one",
               feature: str = "complex", secure: bool = False) -> StudyPlan:
    """The split of ``epsilon`` (what round 0 leaves) between the sketch and ``rounds`` rounds,
    and m (:func:`study_size`) where the operator gave none: the rounds take ``round_share``,
    else ROUND_SHARE, or BLIND_ROUND_SHARE when the sketch at ROUND_SHARE's rest would be blind
    (:func:`blind`: its ε is worth more in the rounds; m is then planned at the smaller rest)."""
    share = ROUND_SHARE if round_share is None else round_share
    sketch_eps, refine = split_study_epsilon(epsilon, rounds, share, round_seconds)
    size = None
    if m is None or round_share is None:
        size = study_size(records_per_device, devices, d, k, sketch_eps, neighbouring=neighbouring,
                          feature=feature, secure=secure)
        if round_share is None and rounds and blind(size):
            share = BLIND_ROUND_SHARE
            sketch_eps, refine = split_study_epsilon(epsilon, rounds, share, round_seconds)
            size = study_size(records_per_device, devices, d, k, sketch_eps, neighbouring=neighbouring,
                              feature=feature, secure=secure)
    return StudyPlan(sketch_eps, refine, size.m if m is None else m, size, share)
