"""The DPLloyd family's privacy budget (MECHANISMS §5–6): what one Lloyd iteration spends, how an
iteration's ε is split between the count and the coordinate sums, and Su et al.'s iteration rule.

One iteration releases, for every cluster j (empty ones included), its count N_j and coordinate
sums S_{j,l} of records shifted into [−h_l, h_l] (:func:`fedsketch.common.dp.lloyd.noisy_cluster_stats`).

* add/remove: one record changes one cluster's count by 1 and its sum coordinate l by at most
  h_l; the clusters partition the records, so all k clusters cost what one costs (parallel
  composition): L1 sensitivity 1 (count), h_l (sum coordinate l), 1 + Σ_l h_l in all.
* replace-one: a replaced record can leave one cluster and join another, so two clusters change;
  L1 sensitivity 2(1 + Σ_l h_l): an add/remove calibration to ε_t/2 spends ε_t.

Every iteration's shares are recorded in a :class:`BudgetTrace`: each share is the ε of an
add/remove proof, and the relation factor (2 under replace-one) turns them into the spend.
Iterations and the optional noisy record count compose sequentially.

Units: ε, budget shares and ρ are dimensionless; h in data units; counts in records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsketch.common.dp.calibration import laplace_scale
from fedsketch.common.dp.lloyd import relation_factor, su_ratio, su_split

#: Share of ε spent on the noisy record count that sets Su's T under add/remove (§6.4).
SU_COUNT_SHARE = 0.05
#: Su's iteration rule (§6.4): the per-iteration MSE target and the bounds on T.
SU_MSE_TARGET = 0.004
SU_MIN_ITERATIONS, SU_MAX_ITERATIONS = 2, 7


def classical_split(eps_t: float, h: np.ndarray) -> tuple[float, np.ndarray]:
    """Classical DPLloyd split of one iteration's add/remove budget ε_t (§5.2–5.3):
    ε_count = ε_t/(1 + Σh), ε_dim,l = h_l·ε_t/(1 + Σh), so every count and sum coordinate gets
    the same Laplace scale (1 + Σh)/ε_t (data units for sums, records for counts)."""
    h = np.asarray(h, dtype=np.float64)
    total = 1.0 + float(h.sum())
    return eps_t / total, h * (eps_t / total)


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
        """Scale b = 1/ε_count (records) of this iteration's noisy cluster counts, which carry
        DLap(e^{−1/b}) noise (mean |noise| ≈ b for small ε_count)."""
        return laplace_scale(1.0, self.eps_count)

    @property
    def epsilon(self) -> float:
        """ε spent by this iteration under the task's relation: factor·(ε_count + Σ ε_dim)."""
        return self.factor * math.fsum((self.eps_count, *self.eps_dims))


@dataclass(frozen=True)
class BudgetTrace:
    """Every spend of one DPLloyd run: an optional noisy record count (``count_epsilon``, discrete
    Laplace of scale 1/count_epsilon, add/remove sensitivity 1) and the iterations, in order."""

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
