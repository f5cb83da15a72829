"""The k-means family of ``fedsketch compare``: a non-private reference, DPLloyd, DPLloyd with the
Su et al. improvements (and fedsketch's over-seeded variant of it), and white / colored Gaussian
noise on converged centroids. :data:`METHODS` maps each CLI method name to its mechanism, a
function of a :class:`~fedsketch.server.bench.task.Task` returning an
:class:`~fedsketch.server.bench.task.Outcome`.

* :mod:`.engine`: non-private k-means (k-means++ seeding, weighted Lloyd, best of restarts) and
  the ``kmeans`` reference method;
* :mod:`.budget`: what a DPLloyd iteration spends: sensitivities, the classical and Su splits,
  Su's iteration rule, budget traces, the neighbouring relation's factor;
* :mod:`.dplloyd`: ``dplloyd``, ``dplloyd-su``, ``dplloyd-su-overseed``, pure ε-DP given a public
  box (MECHANISMS §5–6);
* :mod:`.gaussian`: ``white`` and ``colored`` Gaussian noise on converged centroids,
  local-sensitivity (ε, δ) heuristics, not worst-case DP (§7).

The Lloyd step itself (assignment, cluster statistics, the noisy count-and-sum release) lives in
:mod:`fedsketch.common.dp.lloyd`.

Noise: every privacy draw of the family is exact integer noise from OS random bits, added to an
integer release on a public grid (MECHANISMS §1.9 item 7; :mod:`fedsketch.common.dp.grid`):
DPLloyd's counts, encoded sums and noisy record count (discrete Laplace), the whitened centroids of
``white`` and ``colored`` (discrete Gaussian). ``Task.rng`` drives only data-independent starts,
post-processing of released values and the non-private reference.

Units: records, boxes, centroids and Laplace scales are in data units; Gaussian covariances in
squared data units; ε, γ and budget shares are dimensionless. ``Outcome.clipped`` (rows moved onto
the box) is a non-private operator diagnostic; ``Outcome.notes`` is JSON (budget trace for
DPLloyd; calibration for §7, its data-dependent diagnostics under ``"non_private"``).
"""

from __future__ import annotations

from collections.abc import Callable

from fedsketch.common.dp.lloyd import OVERSEED_KEEP_SCALES
from fedsketch.server.bench.kmeans.budget import (
    IterationBudget,
    classical_split,
    dplloyd_budget,
    su_budget,
    su_iterations,
    su_split,
)
from fedsketch.server.bench.kmeans.dplloyd import (
    dplloyd,
    dplloyd_su,
    dplloyd_su_overseed,
    overseeded,
    uniform_init,
)
from fedsketch.server.bench.kmeans.engine import kmeans_reference
from fedsketch.server.bench.kmeans.gaussian import (
    COVER_TOL,
    colored_gaussian,
    colored_plan,
    converged_clusters,
    gaussian_release,
    min_trace_cover,
    white_gaussian,
    white_plan,
)
from fedsketch.server.bench.task import Outcome, Task
from fedsketch.server.decode.kmeans import converged_kmeans, kmeans_plus_plus, lloyd
from fedsketch.server.decode.overseed import (
    OVERSEED,
    RELOCATE_STEP,
    reduce_centroids,
    relocate_unreliable,
    sphere_packing_init,
)

METHODS: dict[str, Callable[[Task], Outcome]] = {
    "kmeans": kmeans_reference,
    "dplloyd": dplloyd,
    "dplloyd-su": dplloyd_su,
    "dplloyd-su-overseed": dplloyd_su_overseed,
    "white": white_gaussian,
    "colored": colored_gaussian,
}

#: The registry and the names tests and benchmarks reach through the package.
__all__ = [
    "COVER_TOL", "METHODS", "OVERSEED", "OVERSEED_KEEP_SCALES", "RELOCATE_STEP", "IterationBudget",
    "classical_split", "colored_gaussian", "colored_plan", "converged_clusters", "converged_kmeans",
    "dplloyd", "dplloyd_budget", "dplloyd_su", "dplloyd_su_overseed", "gaussian_release",
    "kmeans_plus_plus", "kmeans_reference", "lloyd", "min_trace_cover", "overseeded",
    "reduce_centroids", "relocate_unreliable", "sphere_packing_init", "su_budget", "su_iterations",
    "su_split", "uniform_init", "white_gaussian", "white_plan",
]
