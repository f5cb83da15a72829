"""DPLloyd and its Su et al. variants, pure ε-DP given a public box ``Task.lo``/``Task.hi``
(MECHANISMS §5–6): ``dplloyd``, ``dplloyd-su`` and fedsketch's ``dplloyd-su-overseed``.

Records are clipped into the box and shifted by its centre, so coordinate l lies in [−h_l, h_l],
h_l = (hi_l − lo_l)/2. From a data-independent start, each iteration is one
:func:`fedsketch.common.dp.lloyd.noisy_lloyd_step` (noisy counts and sums of every cluster, then the
clipped means) with the shares of its :class:`~fedsketch.server.bench.kmeans.budget.IterationBudget`;
sensitivities and the replace-one factor are in :mod:`fedsketch.server.bench.kmeans.budget`.
Everything done with released centroids and counts (relocating spare centres, reducing k' centres
to k) is post-processing and uses ``Task.rng``.

Noise: every release is an integer vector with exact discrete-Laplace noise from OS random bits
(the iterations' counts and grid-encoded sums, Su's noisy record count; MECHANISMS §1.9 item 7,
:mod:`fedsketch.common.dp.grid`). ``Outcome.notes`` is JSON with the budget trace.

Units: records, boxes, centroids and Laplace scales of the sums in data units; counts in records;
ε dimensionless.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsketch.common.dp.lloyd import noisy_lloyd_step
from fedsketch.common.dp.samplers import dlap_noise
from fedsketch.common.sketch.box import Box
from fedsketch.common.study.verdict import LastStep, judge
from fedsketch.server.bench.kmeans.budget import (
    BudgetTrace,
    IterationBudget,
    dplloyd_budget,
    su_budget,
    su_count_epsilon,
)
from fedsketch.server.bench.task import Outcome, Task, clip_rows_to_box, public_box, require_finite_epsilon
from fedsketch.server.decode.overseed import (
    OVERSEED,
    reduce_centroids,
    relocate_unreliable,
    sphere_packing_init,
)


@dataclass(frozen=True)
class ShiftedData:
    """Records clipped to the public box and shifted by its centre: coordinate l in [−h_l, h_l]."""

    x: np.ndarray
    centre: np.ndarray
    h: np.ndarray
    clipped: int


def shifted_data(task: Task) -> ShiftedData:
    """Clip ``task.x`` to the public box (ValueError under ``strict``) and shift by its centre."""
    lo, hi = public_box(task)
    x, clipped = clip_rows_to_box(np.asarray(task.x, dtype=np.float64), lo, hi, task.strict)
    centre = Box(lo, hi).center
    return ShiftedData(x - centre, centre, (hi - lo) / 2.0, clipped)


def private_lloyd(data: ShiftedData, init: np.ndarray, trace: BudgetTrace,
                  between: Callable[[np.ndarray, np.ndarray, IterationBudget], np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lloyd iterations on shifted data, one :func:`~fedsketch.common.dp.lloyd.noisy_lloyd_step` per
    entry of ``trace`` with that entry's shares: c_j = clip(g·T~_j/max(N~_j, 1)) to [−h, h]
    (post-processing of the integer release). ``between(c, N~, budget)``, when
    given, maps the released centroids and counts of the iteration with that budget to the next
    iteration's centres, after every iteration but the last; it sees only released values, so it
    is post-processing too. Returns the shifted centroids (k, d), the last iteration's noisy
    counts N~ (k,) (records; released, so free to reuse) and the centres it started from (k, d)."""
    c = before = init
    counts = np.zeros(init.shape[0], dtype=np.int64)
    for t, it in enumerate(trace.iterations):
        before = c
        c, counts = noisy_lloyd_step(data.x, c, data.h, it.eps_count, np.array(it.eps_dims))
        if between is not None and t < len(trace.iterations) - 1:
            c = between(c, counts, it)
    return c, counts, before


def last_step(data: ShiftedData, before: np.ndarray, after: np.ndarray, counts: np.ndarray,
              budget: IterationBudget) -> LastStep:
    """The verdict's view of a run's last noisy step (:class:`~fedsketch.common.study.verdict.LastStep`,
    data units): counts with Laplace scale b = 1/ε_count, sums with h_l/ε_dim,l (standard
    deviations √2 times those)."""
    return LastStep(before + data.centre, after + data.centre, np.asarray(counts, dtype=float),
                    float(np.sqrt(2.0) * budget.count_scale),
                    np.sqrt(2.0) * data.h / np.array(budget.eps_dims))


def uniform_init(k: int, h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """k centres uniform in the shifted box Π[−h_l, h_l], independent of the data."""
    return rng.uniform(-h, h, size=(k, h.size))


def _pure_outcome(task: Task, data: ShiftedData, centroids: np.ndarray, notes: dict,
                  step: LastStep) -> Outcome:
    """The pure ε-DP outcome of a DPLloyd run: shifted ``centroids`` (k, d) moved back by the box
    centre (data units), all of ``task.epsilon`` spent, δ = 0, ``notes`` as JSON, and the verdict
    on them from the run's last noisy ``step``."""
    c = centroids + data.centre
    return Outcome(c, task.epsilon, 0.0, task.neighbouring, "pure", data.clipped, json.dumps(notes),
                   verdict=judge(c, data.h, step=step))


def dplloyd(task: Task, iterations: int = 5) -> Outcome:
    """DPLloyd, pure ε-DP (§5): clip to the public box, shift by its centre, uniform init in the
    box from ``Task.rng`` (data-independent), then T = ``iterations`` (public) noisy iterations
    of ε/T each with one shared Laplace scale b = (1 + Σ_l h_l)·T·f/ε, f = 2 under replace-one,
    1 under add/remove (sensitivities in :mod:`fedsketch.server.bench.kmeans.budget`). Noisy counts are
    clamped to ≥ 1 and centroids clipped to the box. ``notes`` is JSON with the budget trace."""
    require_finite_epsilon(task, "dplloyd", "kmeans")
    data = shifted_data(task)
    trace = dplloyd_budget(task.epsilon, task.neighbouring, data.h, iterations)
    c, counts, before = private_lloyd(data, uniform_init(task.k, data.h, task.rng), trace)
    return _pure_outcome(task, data, c, {"budget_trace": trace.to_dict(), "init": "uniform"},
                         last_step(data, before, c, counts, trace.iterations[-1]))


def public_count(n: int, count_epsilon: float) -> float:
    """n itself when ``count_epsilon`` is 0 (replace-one: n public), else max(n + DLap(ε), 1)
    with ε = ``count_epsilon`` (add/remove sensitivity 1, an integer release)."""
    if count_epsilon == 0.0:
        return float(n)
    return float(max(n + int(dlap_noise(count_epsilon, 1.0, 1)[0]), 1))


@dataclass(frozen=True)
class SuRun:
    """One private Lloyd run with Su et al.'s init, split and iteration rule on ``k_run``
    centres: shifted data, the budget trace, the public n, the packing radius a, the released
    shifted centroids (k_run, d) with their last noisy counts (k_run,), and how many centres
    :func:`relocate_unreliable` moved after each iteration but the last (empty unless asked)."""

    data: ShiftedData
    trace: BudgetTrace
    n_public: float
    packing_radius: float
    centroids: np.ndarray
    counts: np.ndarray
    relocated: tuple[int, ...] = ()
    before: np.ndarray | None = None

    def step(self) -> LastStep:
        """The last iteration's release as the verdict reads it."""
        return last_step(self.data, self.before, self.centroids, self.counts, self.trace.iterations[-1])

    def notes(self) -> dict:
        """JSON-ready diagnostics: the budget trace, T, the public n, the init and its radius a."""
        return {"budget_trace": self.trace.to_dict(), "iterations": len(self.trace.iterations),
                "n_public": self.n_public, "init": "sphere-packing", "packing_radius": self.packing_radius}


def su_run(task: Task, k_run: int, relocate: bool = False, seeds: np.ndarray | None = None) -> SuRun:
    """Sphere-packing init of ``k_run`` centres (§6.1, from ``Task.rng``, data-independent, scaled
    to the box), the count/sum split of :func:`su_split`, and T from :func:`su_iterations` on
    ``k_run`` clusters with a public n (:func:`su_budget`). ``relocate`` applies
    :func:`relocate_unreliable` (with ``Task.rng``, gated on ``Task.k`` reliable centroids, not
    ``k_run``) between iterations: not part of Su et al. ``seeds`` (s, d), s ≤ ``k_run``, shifted
    by the box centre and released earlier (CKM's centroids), replace the first s packed centres:
    the start stays independent of the records given what was already released."""
    require_finite_epsilon(task, "dplloyd-su", "kmeans")
    data = shifted_data(task)
    n_public = public_count(task.x.shape[0], su_count_epsilon(task.epsilon, task.neighbouring))
    trace = su_budget(task.epsilon, task.neighbouring, n_public, k_run, task.d)
    init, a = sphere_packing_init(k_run, task.d, task.rng)
    init = init * data.h
    if seeds is not None:
        if seeds.shape[0] > k_run or seeds.shape[1] != task.d:
            raise ValueError(f"seeds must be (s <= {k_run}, {task.d}), got {seeds.shape}")
        init[:seeds.shape[0]] = np.clip(seeds, -data.h, data.h)
    relocated: list[int] = []

    def between(c: np.ndarray, counts: np.ndarray, budget: IterationBudget) -> np.ndarray:
        """:func:`relocate_unreliable` on one iteration's release, recording how many moved."""
        moved, how_many = relocate_unreliable(c, counts, budget.count_scale, task.k, data.h, task.rng)
        relocated.append(how_many)
        return moved

    c, counts, before = private_lloyd(data, init, trace, between if relocate else None)
    return SuRun(data, trace, n_public, a, c, counts, tuple(relocated), before)


def dplloyd_su(task: Task) -> Outcome:
    """DPLloyd with Su et al.'s improvements, pure ε-DP (§6): :func:`su_run` on k centres.

    * replace-one: n is public; the iterations get all of ε (each calibrated to ε/(2T)).
    * add/remove: n is private; SU_COUNT_SHARE·ε (5 %) buys n~ = n + DLap(0.05ε) (sensitivity
      1), used as max(n~, 1) in the rule, and the iterations share the remaining 0.95ε.

    ``notes`` is JSON: the budget trace, T, the public n used, the packing radius a.
    """
    run = su_run(task, task.k)
    return _pure_outcome(task, run.data, run.centroids, run.notes(), run.step())


def overseeded(task: Task, factor: int = OVERSEED, relocate: bool = True,
               seeds: np.ndarray | None = None) -> tuple[np.ndarray, SuRun, int]:
    """:func:`su_run` on factor·k centres (the first of them ``seeds`` when given, with
    :func:`relocate_unreliable` between iterations when ``relocate``), then
    :func:`reduce_centroids` to k with the box centre as the fallback. Returns (shifted centres
    (k, d), the run, how many released centroids were reliable). The reduction's weighted means
    of centres on the box's face can round one ulp past it: they are clipped back to [−h, h]."""
    run = su_run(task, factor * task.k, relocate, seeds)
    centres, reliable = reduce_centroids(run.centroids, run.counts, run.trace.iterations[-1].count_scale,
                                         task.k, task.rng, np.zeros(task.d))
    return np.clip(centres, -run.data.h, run.data.h), run, reliable


def dplloyd_su_overseed(task: Task) -> Outcome:
    """fedsketch's over-seeded variant of DPLloyd + Su (not in Su et al. or MECHANISMS §6), pure
    ε-DP with exactly :func:`dplloyd_su`'s spend: :func:`overseeded`, that is :func:`su_run` on
    k' = OVERSEED·k centres (T from the rule at k', so the same or fewer iterations) with
    :func:`relocate_unreliable` between iterations, then :func:`reduce_centroids` to k centres
    (with the box centre as the fallback). Relocation and reduction see only released centroids
    and counts: post-processing.

    Why: Lloyd from any data-independent start stalls in local optima on well-separated data
    (one centre straddling two clusters, two sharing one). With five centres per cluster, and
    the empty ones moved beside the heavy ones after each iteration, every cluster is likely to
    hold some, and the reduction merges them. The price is noisier centroids (k' clusters of
    n/k' records). ``notes`` adds the over-seeding factor, the number of centres relocated after
    each iteration but the last, and how many released centroids were reliable.
    """
    centres, run, reliable = overseeded(task)
    notes = {**run.notes(), "overseed": OVERSEED, "relocated": list(run.relocated),
             "reliable_centroids": reliable}
    return _pure_outcome(task, run.data, centres, notes, run.step())
