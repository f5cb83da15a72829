"""The k-means family of ``fedsketch compare``: a non-private reference, DPLloyd, DPLloyd with the
Su et al. improvements (and fedsketch's over-seeded variant of it), and white / colored Gaussian
noise on converged centroids.

Units: records, boxes, centroids and Laplace scales are in data units; Gaussian covariances in
squared data units; ε, γ and budget shares are dimensionless.

DPLloyd family (MECHANISMS §5–6), pure ε-DP given a public box ``Task.lo``/``Task.hi``.
Records are clipped into the box and shifted by its centre, so coordinate l lies in
[−h_l, h_l], h_l = (hi_l − lo_l)/2. Given the previous (public, noisy) centroids, one iteration
releases, for every cluster j (empty ones included), its count N_j and coordinate sums S_{j,l}.

* add/remove: one record changes one cluster's count by 1 and its sum coordinate l by at most
  h_l; the clusters partition the records, so all k clusters cost what one costs (parallel
  composition): L1 sensitivity 1 (count), h_l (sum coordinate l), 1 + Σ_l h_l in all.
* replace-one: a replaced record can leave one cluster and join another, so two clusters change;
  L1 sensitivity 2(1 + Σ_l h_l): an add/remove calibration to ε_t/2 spends ε_t.

Every iteration's shares are recorded in a :class:`BudgetTrace`: each share is the ε of an
add/remove proof, and the relation factor (2 under replace-one) turns them into the spend.

White / colored Gaussian (§7), local-sensitivity (ε, δ) heuristics: noise N(0, Σ) on the
centroids of a converged non-private k-means of the clipped records, calibrated so that every
local difference Δ of the fixed-assignment model satisfies ΔᵀΣ⁻¹Δ ≤ γ. **Local sensitivity is not
a worst-case DP guarantee**: Σ depends on the data, and re-clustering after a change is ignored.

``Outcome.clipped`` (rows moved onto the box) is an operator diagnostic and is not privatized;
``Outcome.notes`` is JSON (budget trace for DPLloyd; calibration diagnostics for §7).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy.spatial.distance import cdist

from fedsketch.common.calibration import gamma_mahalanobis, gauss_sigma_analytic, laplace_scale
from fedsketch.common.lloyd import cluster_stats, nearest, noisy_lloyd_step
from fedsketch.common.privacy import noise_rng
from fedsketch.server.bench.task import Outcome, Task, clip_rows_to_box, require_finite_epsilon

#: Su et al.'s coordinate normalisation factor ρ (§6.2).
RHO = 0.225
#: Share of ε spent on the noisy record count that sets Su's T under add/remove (§6.4).
SU_COUNT_SHARE = 0.05
#: Su's iteration rule (§6.4): the per-iteration MSE target and the bounds on T.
SU_MSE_TARGET = 0.004
SU_MIN_ITERATIONS, SU_MAX_ITERATIONS = 2, 7
#: Sphere packing (§6.1): failures tolerated per centre, bisection steps on the radius a.
PACKING_MAX_FAIL = 100
PACKING_STEPS = 20
#: fedsketch's over-seeded Su variant: centres run per cluster, the noisy-count level (in count
#: noise scales) at or below which a centroid is dropped, k-means restarts of the reduction, and
#: how far a spare centre lands from the centroid it is sent to split (a fraction of the
#: distance from that centroid to its nearest reliable neighbour).
OVERSEED = 5
OVERSEED_KEEP_SCALES = 3.0
OVERSEED_RESTARTS = 20
RELOCATE_STEP = 0.25
#: Non-private reference: k-means++ restarts (paper 004's "3 replicates"), Lloyd limits.
REFERENCE_RESTARTS = 3
LLOYD_MAX_ITER = 300
LLOYD_TOL = 1e-4
#: The colored mechanism enumerates the 2^d corners of the box.
MAX_CORNER_DIM = 12
#: Fixed point of §7.6: target relative duality gap, iteration cap, full check period, pruning.
COVER_TOL = 1e-4
COVER_MAX_ITER = 20000
COVER_CHECK_EVERY = 100
COVER_PRUNE = 1e-12


# ---------------------------------------------------------------------------------------------
# Shared helpers


def relation_factor(neighbouring: str) -> int:
    """2 under replace-one (a record change touches two clusters: twice the add/remove L1
    sensitivity of the joint release), 1 under add/remove (§0.3, §5.1)."""
    if neighbouring not in ("add_remove", "replace_one"):
        raise ValueError(f"unknown neighbouring relation {neighbouring!r}")
    return 2 if neighbouring == "replace_one" else 1


def public_box(task: Task) -> tuple[np.ndarray, np.ndarray]:
    """The public box (lo, hi), each (d,) float64 in data units; scalars are broadcast."""
    if task.lo is None or task.hi is None:
        raise ValueError("this mechanism needs a public box: give Task.lo and Task.hi")
    sides = []
    for name, side in (("lo", task.lo), ("hi", task.hi)):
        v = np.asarray(side, dtype=np.float64)
        if v.shape not in ((), (task.d,)):
            raise ValueError(f"box {name} must be a scalar or have shape ({task.d},), got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError(f"box {name} must be finite")
        sides.append(np.broadcast_to(v, (task.d,)).copy())
    return sides[0], sides[1]


# ---------------------------------------------------------------------------------------------
# Non-private reference


def kmeans_plus_plus(x: np.ndarray, k: int, rng: np.random.Generator,
                     weights: np.ndarray | None = None) -> np.ndarray:
    """Greedy k-means++ seeding: each new centre is the best (lowest potential Σ w·D²) of
    2 + ⌊ln k⌋ candidates drawn with probability ∝ w(x)·D(x)², D the distance to the chosen
    centres; w ≡ 1 without ``weights`` (n,), and the first centre is drawn ∝ w."""
    n = x.shape[0]
    w = np.ones(n) if weights is None else weights
    trials = 2 + int(math.log(k))
    x_sq = np.einsum("ij,ij->i", x, x)

    def draw(mass: np.ndarray, size: int | None) -> np.ndarray:
        cumulative = np.cumsum(mass)
        return np.minimum(np.searchsorted(cumulative, rng.uniform(0.0, cumulative[-1], size),
                                          side="right"), n - 1)

    first = int(rng.integers(n)) if weights is None else int(draw(w, None))
    chosen = [first]
    d2 = np.maximum(x_sq - 2.0 * (x @ x[first]) + x_sq[first], 0.0)
    for _ in range(1, k):
        picks = draw(w * d2, trials)
        cand = np.maximum(x_sq[:, None] - 2.0 * (x @ x[picks].T) + x_sq[picks][None, :], 0.0)
        cand = np.minimum(cand, d2[:, None])
        best = int((cand.sum(axis=0) if weights is None else w @ cand).argmin())
        chosen.append(int(picks[best]))
        d2 = cand[:, best]
    return x[chosen].astype(np.float64)


def _lloyd_means(x: np.ndarray, labels: np.ndarray, d2: np.ndarray, k: int,
                 weights: np.ndarray | None) -> np.ndarray:
    """(Weighted) cluster means; an empty cluster is re-seeded at one of the records farthest
    from its centre."""
    counts, sums = cluster_stats(x, labels, k, weights)
    empty = np.flatnonzero(counts == 0)
    means = sums / np.where(counts > 0, counts, 1.0)[:, None]
    if empty.size:
        means[empty] = x[np.argpartition(d2, -empty.size)[-empty.size:]]
    return means


def lloyd(x: np.ndarray, init: np.ndarray,
          weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Non-private Lloyd from ``init`` until the squared centre shift Σ_j‖Δc_j‖² is at most
    LLOYD_TOL × (mean per-feature variance) or LLOYD_MAX_ITER; returns (centroids, labels, SSE).
    With ``weights`` (n,) > 0, record i counts w_i times: weighted means, variance and
    SSE = Σ_i w_i min_j ‖x_i − c_j‖²."""
    tol = LLOYD_TOL * float(np.mean(np.average((x - np.average(x, axis=0, weights=weights)) ** 2,
                                               axis=0, weights=weights)))
    c = init
    for _ in range(LLOYD_MAX_ITER):
        labels, d2 = nearest(x, c)
        new = _lloyd_means(x, labels, d2, c.shape[0], weights)
        shift = float(((new - c) ** 2).sum())
        c = new
        if shift <= tol:
            break
    labels, d2 = nearest(x, c)
    return c, labels, float(d2.sum() if weights is None else weights @ d2)


def converged_kmeans(x: np.ndarray, k: int, rng: np.random.Generator, restarts: int = REFERENCE_RESTARTS,
                     weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best-SSE (centroids (k, d), labels (n,)) of ``restarts`` k-means++ + Lloyd runs (weighted
    by ``weights`` (n,) > 0 when given)."""
    x = np.asarray(x, dtype=np.float64)
    best = None
    for _ in range(restarts):
        c, labels, sse = lloyd(x, kmeans_plus_plus(x, k, rng, weights), weights)
        if best is None or sse < best[2]:
            best = (c, labels, sse)
    return best[0], best[1]


def kmeans_reference(task: Task) -> Outcome:
    """Non-private k-means (k-means++ seeding, 3 restarts, best SSE) on the raw records, using
    ``Task.rng``. No box, no noise: kind "none", ε = ∞."""
    centroids, _ = converged_kmeans(task.x, task.k, task.rng)
    return Outcome(centroids, math.inf, 0.0, task.neighbouring, "none")


# ---------------------------------------------------------------------------------------------
# Budget splits and traces (DPLloyd family)


def classical_split(eps_t: float, h: np.ndarray) -> tuple[float, np.ndarray]:
    """Classical DPLloyd split of one iteration's add/remove budget ε_t (§5.2–5.3):
    ε_count = ε_t/(1 + Σh), ε_dim,l = h_l·ε_t/(1 + Σh), so every count and sum coordinate gets
    the same Laplace scale (1 + Σh)/ε_t (data units for sums, records for counts)."""
    h = np.asarray(h, dtype=np.float64)
    total = 1.0 + float(h.sum())
    return eps_t / total, h * (eps_t / total)


def su_ratio(d: int) -> float:
    """c_ρ = cbrt(4dρ²): Su et al.'s ratio ε_count/ε_dim (§6.2)."""
    return float(np.cbrt(4.0 * d * RHO**2))


def su_split(eps_t: float, d: int) -> tuple[float, float]:
    """Su et al.'s split (§6.2): each sum coordinate ε_dim = ε_t/(d + c_ρ), the count
    ε_count = c_ρ·ε_t/(d + c_ρ) (so ε_count/ε_dim = c_ρ and ε_count + d·ε_dim = ε_t).
    diffprivlib inverts the two (§6.3); this is the direction of the MSE derivation."""
    c = su_ratio(d)
    return c * eps_t / (d + c), eps_t / (d + c)


def su_iterations(epsilon: float, n: float, k: int, d: int) -> int:
    """Su et al.'s iteration rule (§6.4): T = ⌊clip(ε/ε_m, 2, 7)⌋ with
    ε_m = sqrt((2/0.004)·k³(d + c_ρ)³/n²), the per-iteration ε at which the summed centroid MSE
    on [−1, 1]^d is 0.004. ``epsilon`` is the add/remove-equivalent budget of all iterations and
    ``n`` must be public (true n under replace-one, a noisy count under add/remove)."""
    eps_m = math.sqrt(2.0 / SU_MSE_TARGET * k**3 * (d + su_ratio(d)) ** 3) / n
    return int(math.floor(min(max(epsilon / eps_m, SU_MIN_ITERATIONS), SU_MAX_ITERATIONS)))


def su_count_epsilon(epsilon: float, neighbouring: str) -> float:
    """ε of the noisy record count behind Su's T: SU_COUNT_SHARE·ε under add/remove (n private),
    0 under replace-one (n public)."""
    relation_factor(neighbouring)
    return SU_COUNT_SHARE * epsilon if neighbouring == "add_remove" else 0.0


@dataclass(frozen=True)
class IterationBudget:
    """One Lloyd iteration: ``eps_count`` and ``eps_dims`` (d,) are the add/remove ε of the count
    and of each sum coordinate; ``factor`` is :func:`relation_factor`."""

    eps_count: float
    eps_dims: tuple[float, ...]
    factor: int

    @property
    def count_scale(self) -> float:
        """Laplace scale b = 1/ε_count (records) of this iteration's noisy cluster counts."""
        return laplace_scale(1.0, self.eps_count)

    @property
    def epsilon(self) -> float:
        """ε spent by this iteration under the task's relation: factor·(ε_count + Σ ε_dim)."""
        return self.factor * math.fsum((self.eps_count, *self.eps_dims))


@dataclass(frozen=True)
class BudgetTrace:
    """Every spend of one DPLloyd run: an optional noisy record count (``count_epsilon``, Laplace
    of scale 1/count_epsilon, add/remove sensitivity 1) and the iterations, in order."""

    neighbouring: str
    count_epsilon: float
    iterations: tuple[IterationBudget, ...]

    @property
    def total(self) -> float:
        """Overall ε (sequential composition over the count and the iterations)."""
        return math.fsum((self.count_epsilon, *(it.epsilon for it in self.iterations)))

    def to_dict(self) -> dict:
        """JSON-ready form: per-iteration shares and spends, and the total."""
        return {
            "neighbouring": self.neighbouring,
            "count_epsilon": self.count_epsilon,
            "iterations": [{"eps_count": it.eps_count, "eps_dims": list(it.eps_dims),
                            "factor": it.factor, "epsilon": it.epsilon} for it in self.iterations],
            "total": self.total,
        }


def dplloyd_budget(epsilon: float, neighbouring: str, h: np.ndarray, iterations: int) -> BudgetTrace:
    """Classical DPLloyd: ε/T per iteration, split by :func:`classical_split` after dividing by
    the relation factor (replace-one calibrates each iteration to ε/(2T) add/remove)."""
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    factor = relation_factor(neighbouring)
    eps_count, eps_dims = classical_split(epsilon / iterations / factor, h)
    it = IterationBudget(eps_count, tuple(float(e) for e in eps_dims), factor)
    return BudgetTrace(neighbouring, 0.0, (it,) * iterations)


def su_budget(epsilon: float, neighbouring: str, n_public: float, k: int, d: int) -> BudgetTrace:
    """Su et al.: ε minus :func:`su_count_epsilon` for the iterations; T from
    :func:`su_iterations` on that budget divided by the relation factor and ``n_public``; each
    iteration split by :func:`su_split`."""
    factor = relation_factor(neighbouring)
    count_eps = su_count_epsilon(epsilon, neighbouring)
    eps_ar = (epsilon - count_eps) / factor
    t = su_iterations(eps_ar, n_public, k, d)
    eps_count, eps_dim = su_split(eps_ar / t, d)
    it = IterationBudget(eps_count, (eps_dim,) * d, factor)
    return BudgetTrace(neighbouring, count_eps, (it,) * t)


# ---------------------------------------------------------------------------------------------
# DPLloyd family


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
    centre = (lo + hi) / 2.0
    return ShiftedData(x - centre, centre, (hi - lo) / 2.0, clipped)


def private_lloyd(data: ShiftedData, init: np.ndarray, trace: BudgetTrace,
                  between: Callable[[np.ndarray, np.ndarray, IterationBudget], np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd iterations on shifted data, one :func:`~fedsketch.common.lloyd.noisy_lloyd_step` per
    entry of ``trace`` with that entry's shares and a fresh :func:`noise_rng`:
    c_j = clip(S~_j/max(N~_j, 1)) to [−h, h] (post-processing). ``between(c, N~, budget)``, when
    given, maps the released centroids and counts of the iteration with that budget to the next
    iteration's centres, after every iteration but the last; it sees only released values, so it
    is post-processing too. Returns the shifted centroids (k, d) and the last iteration's noisy
    counts N~ (k,) (records; released, so free to reuse)."""
    c = init
    counts = np.zeros(init.shape[0])
    for t, it in enumerate(trace.iterations):
        c, counts = noisy_lloyd_step(data.x, c, data.h, it.eps_count, np.array(it.eps_dims), noise_rng())
        if between is not None and t < len(trace.iterations) - 1:
            c = between(c, counts, it)
    return c, counts


def uniform_init(k: int, h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """k centres uniform in the shifted box Π[−h_l, h_l], independent of the data."""
    return rng.uniform(-h, h, size=(k, h.size))


def _pack(k: int, d: int, a: float, rng: np.random.Generator) -> np.ndarray | None:
    """One packing attempt in [−1, 1]^d: centres uniform in [−1 + a, 1 − a]^d, kept when at
    distance ≥ 2a from every kept centre; None after PACKING_MAX_FAIL consecutive rejections."""
    centres: list[np.ndarray] = []
    fails = 0
    while len(centres) < k:
        c = rng.uniform(-1.0 + a, 1.0 - a, d)
        if all(np.linalg.norm(c - o) >= 2.0 * a for o in centres):
            centres.append(c)
            fails = 0
        else:
            fails += 1
            if fails >= PACKING_MAX_FAIL:
                return None
    return np.array(centres)


def sphere_packing_init(k: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Su et al.'s data-independent init (§6.1) in normalized coordinates [−1, 1]^d: centres at
    distance ≥ a from the boundary and ≥ 2a from each other, with a found by bisection on
    (0, 1] (PACKING_STEPS steps). Returns (centres (k, d), a); a = 0 always succeeds."""
    best, best_a = _pack(k, d, 0.0, rng), 0.0
    lo, hi = 0.0, 1.0
    for _ in range(PACKING_STEPS):
        mid = (lo + hi) / 2.0
        found = _pack(k, d, mid, rng)
        if found is None:
            hi = mid
        else:
            best, best_a, lo = found, mid, mid
    return best, best_a


def _pure_outcome(task: Task, data: ShiftedData, centroids: np.ndarray, notes: dict) -> Outcome:
    return Outcome(centroids + data.centre, task.epsilon, 0.0, task.neighbouring, "pure",
                   data.clipped, json.dumps(notes))


def dplloyd(task: Task, iterations: int = 5) -> Outcome:
    """DPLloyd, pure ε-DP (§5): clip to the public box, shift by its centre, uniform init in the
    box from ``Task.rng`` (data-independent), then T = ``iterations`` (public) noisy iterations
    of ε/T each with one shared Laplace scale b = (1 + Σ_l h_l)·T·f/ε, f = 2 under replace-one,
    1 under add/remove (see the module docstring for the sensitivities). Noisy counts are
    clamped to ≥ 1 and centroids clipped to the box. ``notes`` is JSON with the budget trace."""
    require_finite_epsilon(task, "dplloyd", "kmeans")
    data = shifted_data(task)
    trace = dplloyd_budget(task.epsilon, task.neighbouring, data.h, iterations)
    c, _ = private_lloyd(data, uniform_init(task.k, data.h, task.rng), trace)
    return _pure_outcome(task, data, c, {"budget_trace": trace.to_dict(), "init": "uniform"})


def public_count(n: int, count_epsilon: float) -> float:
    """n itself when ``count_epsilon`` is 0 (replace-one: n public), else max(n + Lap(1/ε), 1)
    with ε = ``count_epsilon`` (add/remove sensitivity 1), noise from :func:`noise_rng`."""
    if count_epsilon == 0.0:
        return float(n)
    return max(n + float(noise_rng().laplace(0.0, laplace_scale(1.0, count_epsilon))), 1.0)


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

    def notes(self) -> dict:
        return {"budget_trace": self.trace.to_dict(), "iterations": len(self.trace.iterations),
                "n_public": self.n_public, "init": "sphere-packing", "packing_radius": self.packing_radius}


def excess_counts(counts: np.ndarray, count_scale: float) -> np.ndarray:
    """w_j = N~_j − OVERSEED_KEEP_SCALES·b (records), b the Laplace scale of the noisy counts N~.
    Centroid j is reliable when w_j > 0; at or below, its cell cannot be told from an empty one."""
    return counts - OVERSEED_KEEP_SCALES * count_scale


def relocate_unreliable(centroids: np.ndarray, counts: np.ndarray, count_scale: float, k: int,
                        h: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Spare centres go where the mass is, by post-processing of one iteration's release.

    Reliability is :func:`excess_counts` > 0; a data-independent start in d = 10 leaves about
    half of the cells at noise level. Each unreliable centroid moves to c_i + s_i·u, with i a
    reliable centroid drawn with probability ∝ N~_i, s_i = RELOCATE_STEP times the distance from
    c_i to its nearest reliable neighbour (data units; at least 10⁻³·‖h‖ so that two coinciding
    centroids still spread), u uniform on the unit sphere, clipped to the shifted box [−h, h].
    A heavy cell is the likeliest to hold two clusters; a second centre beside it lets the next
    assignment split them. With fewer than max(k, 2) reliable centroids nothing moves: the
    release then cannot tell where k clusters are, and splitting the few reliable cells would
    only push more of them under the noise (measured: it raised the relative SSE at ε = 0.003,
    n = 10^6). Returns (centres (k', d), how many moved).
    """
    reliable = excess_counts(counts, count_scale) > 0
    good, spare = np.flatnonzero(reliable), np.flatnonzero(~reliable)
    if good.size < max(k, 2) or spare.size == 0:
        return centroids, 0
    anchors = centroids[good]
    gaps = cdist(anchors, anchors)
    np.fill_diagonal(gaps, np.inf)
    steps = RELOCATE_STEP * np.maximum(gaps.min(axis=1), 1e-3 * float(np.linalg.norm(h)))
    pick = rng.choice(good.size, size=spare.size, p=counts[good] / counts[good].sum())
    u = rng.standard_normal((spare.size, centroids.shape[1]))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    moved = centroids.copy()
    moved[spare] = np.clip(anchors[pick] + steps[pick, None] * u, -h, h)
    return moved, int(spare.size)


def su_run(task: Task, k_run: int, relocate: bool = False) -> SuRun:
    """Sphere-packing init of ``k_run`` centres (§6.1, from ``Task.rng``, data-independent, scaled
    to the box), the count/sum split of :func:`su_split`, and T from :func:`su_iterations` on
    ``k_run`` clusters with a public n (:func:`su_budget`). ``relocate`` applies
    :func:`relocate_unreliable` (with ``Task.rng``, gated on ``Task.k`` reliable centroids, not
    ``k_run``) between iterations: not part of Su et al."""
    require_finite_epsilon(task, "dplloyd-su", "kmeans")
    data = shifted_data(task)
    n_public = public_count(task.x.shape[0], su_count_epsilon(task.epsilon, task.neighbouring))
    trace = su_budget(task.epsilon, task.neighbouring, n_public, k_run, task.d)
    init, a = sphere_packing_init(k_run, task.d, task.rng)
    relocated: list[int] = []

    def between(c: np.ndarray, counts: np.ndarray, budget: IterationBudget) -> np.ndarray:
        moved, how_many = relocate_unreliable(c, counts, budget.count_scale, task.k, data.h, task.rng)
        relocated.append(how_many)
        return moved

    c, counts = private_lloyd(data, init * data.h, trace, between if relocate else None)
    return SuRun(data, trace, n_public, a, c, counts, tuple(relocated))


def dplloyd_su(task: Task) -> Outcome:
    """DPLloyd with Su et al.'s improvements, pure ε-DP (§6): :func:`su_run` on k centres.

    * replace-one: n is public; the iterations get all of ε (each calibrated to ε/(2T)).
    * add/remove: n is private; SU_COUNT_SHARE·ε (5 %) buys n~ = n + Lap(1/(0.05ε)) (sensitivity
      1), used as max(n~, 1) in the rule, and the iterations share the remaining 0.95ε.

    ``notes`` is JSON: the budget trace, T, the public n used, the packing radius a.
    """
    run = su_run(task, task.k)
    return _pure_outcome(task, run.data, run.centroids, run.notes())


def reduce_centroids(centroids: np.ndarray, counts: np.ndarray, count_scale: float, k: int,
                     rng: np.random.Generator, fallback: np.ndarray) -> tuple[np.ndarray, int]:
    """k centres from k' ≥ k released centroids and noisy counts, by post-processing only.

    A centroid is reliable when its :func:`excess_counts` w_j = N~_j − OVERSEED_KEEP_SCALES·b is
    > 0, b the Laplace scale of the counts (records).

    * At least k reliable: weighted k-means (k-means++ seeding and Lloyd, OVERSEED_RESTARTS
      restarts, best weighted SSE) of the reliable centroids with weights w_j: each centre is
      the w-weighted mean of its group's (clipped) centroids, close to the pooled ΣS~/ΣN~ when
      the counts are well above their noise.
    * Fewer: the reliable centroids, then the data-independent ``fallback`` (d,) (the box centre),
      then the others by decreasing N~, the first k of these. An extra centre never raises the
      SSE, so when noise swamps every count the result is no worse than the box centre alone.

    Returns (centres (k, d), reliable centroids).
    """
    weights = excess_counts(counts, count_scale)
    order = np.argsort(-counts, kind="stable")
    reliable = order[weights[order] > 0]
    if reliable.size >= k:
        centres, _ = converged_kmeans(centroids[reliable], k, rng, OVERSEED_RESTARTS, weights[reliable])
        return centres, int(reliable.size)
    rest = order[weights[order] <= 0]
    return np.vstack([centroids[reliable], fallback, centroids[rest]])[:k], int(reliable.size)


def overseeded(task: Task, factor: int = OVERSEED, relocate: bool = True) -> tuple[np.ndarray, SuRun, int]:
    """:func:`su_run` on factor·k centres (with :func:`relocate_unreliable` between iterations
    when ``relocate``), then :func:`reduce_centroids` to k with the box centre as the fallback.
    Returns (shifted centres (k, d), the run, how many released centroids were reliable)."""
    run = su_run(task, factor * task.k, relocate)
    centres, reliable = reduce_centroids(run.centroids, run.counts, run.trace.iterations[-1].count_scale,
                                         task.k, task.rng, np.zeros(task.d))
    return centres, run, reliable


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
    return _pure_outcome(task, run.data, centres, notes)


# ---------------------------------------------------------------------------------------------
# White and colored Gaussian noise on converged centroids (§7)


@dataclass(frozen=True)
class Clusters:
    """A converged non-private k-means of the clipped records: exact cluster means ``centroids``
    (k, d) of ``labels``, sizes ``counts`` (all ≥ 2), the box and the clipped-row count."""

    x: np.ndarray
    labels: np.ndarray
    centroids: np.ndarray
    counts: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    clipped: int


#: Memoized converged clusterings: few entries, as each holds a copy of the clipped records.
CLUSTERS_CACHE = 2
_CLUSTERS: dict[str, Clusters] = {}


def _memo(cache: dict, limit: int, key: str, compute: Callable[[], object]):
    """``cache[key]``, computed by ``compute`` on a miss; the oldest entry goes beyond ``limit``."""
    if key not in cache:
        if len(cache) >= limit:
            del cache[next(iter(cache))]
        cache[key] = compute()
    return cache[key]


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
        h.update(str(a.shape).encode())
    return h.hexdigest()


def converged_clusters(task: Task) -> Clusters:
    """Clip to the public box, run :func:`converged_kmeans` and take the exact means of its final
    assignment (the query f(X) of §7.1). Refuses clusters with < 2 records.

    The local-sensitivity calibration treats f(X) as a fixed function of X, so it is one: the
    k-means++ seeds come from a generator seeded by the SHA-256 of (clipped records, box, k)
    (``Task.rng`` is not used), and the result is memoized under that digest, so repeated runs
    on one dataset (``fedsketch compare``'s trials) reuse one clustering and differ only in
    their noise. The memo holds a read-only copy of the clipped records; ``clipped`` is counted
    for each call.
    """
    lo, hi = public_box(task)
    x, clipped = clip_rows_to_box(np.asarray(task.x, dtype=np.float64), lo, hi, task.strict)
    key = _digest(x, lo, hi, np.array(task.k))

    def compute() -> Clusters:
        own = x.copy()
        own.setflags(write=False)
        _, labels = converged_kmeans(own, task.k, np.random.default_rng(int(key[:16], 16)))
        counts, sums = cluster_stats(own, labels, task.k)
        if counts.min() < 2:
            raise ValueError(f"every cluster needs >= 2 records for the local sensitivity "
                             f"(x_i − c)/(n_j − 1); smallest has {int(counts.min())}: lower k")
        return Clusters(own, labels, sums / counts[:, None], counts, lo, hi, 0)

    return replace(_memo(_CLUSTERS, CLUSTERS_CACHE, key, compute), clipped=clipped)


def box_corners(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The 2^d corners (2^d, d) of the box Π[lo_l, hi_l]."""
    return np.array(list(itertools.product(*zip(lo, hi, strict=True))), dtype=np.float64)


def constraint_vectors(xj: np.ndarray, cj: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                       neighbouring: str) -> np.ndarray:
    """Local differences of cluster j's centroid (rows, data units), fixed-assignment model.

    Removal of x_i: (x_i − c_j)/(n_j − 1) (§7.1). Addition of x' in the box (a convex constraint
    is worst at a corner): (x' − c_j)/(n_j + 1) under add/remove; under replace-one the rows use
    n_j instead, because a replacement x_i → x' moves c_j by (x_i − c_j)/n_j + (c_j − x')/n_j
    (same cluster) or moves two blocks by (x_i − c)/(n − 1) and (c_j − x')/(n_j + 1): in both
    cases ‖Δ‖_Σ⁻¹ ≤ ‖removal row‖ + ‖addition row‖, covered by the level γ/4 (see
    :func:`constraint_level`).
    """
    n_j = xj.shape[0]
    add_den = n_j + 1 if neighbouring == "add_remove" else n_j
    return np.vstack([(xj - cj) / (n_j - 1), (box_corners(lo, hi) - cj) / add_den])


def constraint_level(epsilon: float, delta: float, neighbouring: str) -> float:
    """γ/f² with γ = gamma_mahalanobis(ε, δ) (analytic, §7.2) and f = relation_factor: under
    replace-one each row of :func:`constraint_vectors` may take a quarter, so that a sum of a
    removal and an addition row stays within γ."""
    return gamma_mahalanobis(epsilon, delta) / relation_factor(neighbouring) ** 2


def _farthest_corner_distance(lo: np.ndarray, hi: np.ndarray, c: np.ndarray) -> float:
    """max over x' in the box of ‖x' − c‖₂ (data units)."""
    return float(np.sqrt(np.maximum((lo - c) ** 2, (hi - c) ** 2).sum()))


def white_sensitivity(clusters: Clusters, neighbouring: str) -> float:
    """Δ2 = max over all rows of :func:`constraint_vectors`, in closed form (no corner
    enumeration): the largest local move of one centroid, data units."""
    add_extra = 1 if neighbouring == "add_remove" else 0
    worst = 0.0
    for j, cj in enumerate(clusters.centroids):
        n_j = clusters.counts[j]
        xj = clusters.x[clusters.labels == j]
        removal = float(np.sqrt(((xj - cj) ** 2).sum(axis=1).max())) / (n_j - 1)
        addition = _farthest_corner_distance(clusters.lo, clusters.hi, cj) / (n_j + add_extra)
        worst = max(worst, removal, addition)
    return worst


@dataclass(frozen=True)
class CoverResult:
    """:func:`min_trace_cover`'s answer: S (d, d), the rescale η applied, the relative duality
    gap (tr S − dual)/tr S certifying near-optimality, and the iterations used."""

    cov: np.ndarray
    eta: float
    gap: float
    iterations: int

    def scaled(self, gamma: float) -> CoverResult:
        """The solution at level γ from this one at level 1: S/γ (same η, gap, iterations)."""
        return CoverResult(self.cov / gamma, self.eta, self.gap, self.iterations)


def _sqrt_and_inv_sqrt(r: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    w, u = np.linalg.eigh(r)
    w = np.maximum(w, 1e-300)
    root = np.sqrt(w)
    return (u * root) @ u.T, (u / root) @ u.T, float(root.sum())


def min_trace_cover(v: np.ndarray, gamma: float, tol: float = COVER_TOL,
                    max_iter: int = COVER_MAX_ITER) -> CoverResult:
    """min tr S over S ≻ 0 subject to v_iᵀS⁻¹v_i ≤ γ for every row v_i (§7.4, §7.6).

    Fixed point of §7.6: R = Σ λ_i v_i v_iᵀ, m_i = v_iᵀR^{−1/2}v_i, λ_i ← λ_i·m_i/γ, S = R^{1/2}.
    Rows with λ_i < COVER_PRUNE·max λ are skipped between full passes (every COVER_CHECK_EVERY
    iterations). At each full pass S is rescaled by η = max_i m_i/γ over ALL rows (so the
    constraints hold with the largest one tight) and the dual 2 tr R^{1/2} − γΣλ (a lower bound
    on the optimum) gives the gap; stop when the gap ≤ ``tol`` or after ``max_iter``.
    The rows must span R^d (the box corners always do).
    """
    lam = np.ones(v.shape[0])
    active = np.arange(v.shape[0])
    it = 0
    while True:
        va = v[active]
        root, inv_root, tr_root = _sqrt_and_inv_sqrt((va * lam[active, None]).T @ va)
        if it % COVER_CHECK_EVERY == 0 or it >= max_iter:
            m = np.einsum("ij,jk,ik->i", v, inv_root, v)
            eta = float(m.max()) / gamma
            dual = 2.0 * tr_root - gamma * float(lam[active].sum())
            gap = (eta * tr_root - dual) / (eta * tr_root)
            if gap <= tol or it >= max_iter:
                return CoverResult(eta * root, eta, gap, it)
            lam *= m / gamma
            active = np.flatnonzero(lam >= COVER_PRUNE * lam.max())
        else:
            lam[active] *= np.einsum("ij,jk,ik->i", va, inv_root, va) / gamma
        it += 1


#: Memoized unit-level covers (a few cluster sets' worth).
UNIT_COVER_CACHE = 64
_UNIT_COVERS: dict[str, CoverResult] = {}


def unit_cover(v: np.ndarray) -> CoverResult:
    """:func:`min_trace_cover` of the rows ``v`` at level γ = 1, memoized by the bytes of ``v``.

    The problem is homogeneous: v_iᵀS⁻¹v_i ≤ γ ⇔ v_iᵀ(γS)⁻¹v_i ≤ 1, so S(γ) = S(1)/γ
    (:meth:`CoverResult.scaled`), and repeated trials on the same clusters solve it once.
    """
    return _memo(_UNIT_COVERS, UNIT_COVER_CACHE, _digest(v), lambda: min_trace_cover(v, 1.0))


@dataclass(frozen=True)
class GaussianPlan:
    """What a §7 mechanism adds noise to: centroids (k, d), per-cluster covariances (k, d, d)
    (squared data units), the constraint level γ, and diagnostics (not privatized)."""

    clusters: Clusters
    covariances: np.ndarray
    gamma: float
    notes: dict


def white_plan(task: Task) -> GaussianPlan:
    """White noise (§7.3): Σ = σ²I_{kd}, σ = analytic-Gaussian(f·Δ2, ε, δ), Δ2 from
    :func:`white_sensitivity`, f = relation_factor (equivalently σ² = Δ2²/(γ/f²))."""
    require_finite_epsilon(task, "white", "kmeans")
    clusters = converged_clusters(task)
    f = relation_factor(task.neighbouring)
    delta2 = white_sensitivity(clusters, task.neighbouring)
    sigma = gauss_sigma_analytic(f * delta2, task.epsilon, task.delta)
    cov = np.broadcast_to(sigma**2 * np.eye(task.d), (task.k, task.d, task.d)).copy()
    gamma = constraint_level(task.epsilon, task.delta, task.neighbouring)
    notes = {"sigma": sigma, "sensitivity": delta2, "trace": float(task.k * task.d * sigma**2)}
    return GaussianPlan(clusters, cov, gamma, notes)


def colored_plan(task: Task) -> GaussianPlan:
    """Colored noise (§7.4–7.6): per cluster, S_j = :func:`min_trace_cover` of the rows of
    :func:`constraint_vectors` at level :func:`constraint_level` (exact fixed point, rescaled to
    feasibility); the blocks are independent (each row lives in one cluster's block)."""
    require_finite_epsilon(task, "colored", "kmeans")
    if task.d > MAX_CORNER_DIM:
        raise ValueError(f"colored noise enumerates the 2^d box corners; d = {task.d} > {MAX_CORNER_DIM}")
    clusters = converged_clusters(task)
    gamma = constraint_level(task.epsilon, task.delta, task.neighbouring)
    covers = [unit_cover(constraint_vectors(clusters.x[clusters.labels == j], cj, clusters.lo,
                                            clusters.hi, task.neighbouring)).scaled(gamma)
              for j, cj in enumerate(clusters.centroids)]
    cov = np.stack([c.cov for c in covers])
    notes = {"gamma": gamma, "trace": float(np.trace(cov, axis1=1, axis2=2).sum()),
             "max_rescale": max(c.eta for c in covers), "max_duality_gap": max(c.gap for c in covers),
             "max_iterations": max(c.iterations for c in covers)}
    return GaussianPlan(clusters, cov, gamma, notes)


def gaussian_release(task: Task, plan: GaussianPlan) -> Outcome:
    """c_j + N(0, Σ_j) for every cluster j, noise from :func:`noise_rng`; kind
    "local-sensitivity" (not a worst-case DP guarantee). ``notes`` is JSON diagnostics."""
    w, u = np.linalg.eigh(plan.covariances)
    roots = u * np.sqrt(np.maximum(w, 0.0))[:, None, :]
    z = noise_rng().standard_normal((task.k, task.d))
    noisy = plan.clusters.centroids + np.einsum("kij,kj->ki", roots, z)
    return Outcome(noisy, task.epsilon, task.delta, task.neighbouring, "local-sensitivity",
                   plan.clusters.clipped, json.dumps(plan.notes))


def white_gaussian(task: Task) -> Outcome:
    """White Gaussian noise on converged k-means centroids (§7.3), calibrated to the LOCAL
    sensitivity Δ2 = max_i ‖Δ_i‖ of the given data (removals, and additions anywhere in the
    public box; fixed assignments). Local sensitivity is not a worst-case DP guarantee: it is
    computed on X and ignores re-clustering, so this is labelled "local-sensitivity"."""
    return gaussian_release(task, white_plan(task))


def colored_gaussian(task: Task) -> Outcome:
    """Colored Gaussian noise on converged k-means centroids (Ravi–Scaglione–Peisert, §7.6):
    the minimum-trace covariance meeting Δ_iᵀΣ⁻¹Δ_i ≤ γ for every local difference, solved
    exactly per cluster (not the paper's Lemma 5, which is wrong in general, §7.5). Local
    sensitivity is not a worst-case DP guarantee: Σ itself depends on the data and re-clustering
    is ignored; labelled "local-sensitivity"."""
    return gaussian_release(task, colored_plan(task))


METHODS: dict[str, Callable[[Task], Outcome]] = {
    "kmeans": kmeans_reference,
    "dplloyd": dplloyd,
    "dplloyd-su": dplloyd_su,
    "dplloyd-su-overseed": dplloyd_su_overseed,
    "white": white_gaussian,
    "colored": colored_gaussian,
}
