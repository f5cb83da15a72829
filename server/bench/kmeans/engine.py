"""The family's non-private ``kmeans`` reference: the weighted k-means engine of
:mod:`fedsketch.server.decode.kmeans` (k-means++, Lloyd to convergence, best SSE of restarts) on
the raw records. DPLloyd's over-seeded variant reuses that engine to reduce released centroids
(post-processing), and the Gaussian mechanisms use it for the converged clustering they add noise
to.
"""

from __future__ import annotations

import math

from fedsketch.server.bench.task import Outcome, Task
from fedsketch.server.decode.kmeans import converged_kmeans


def kmeans_reference(task: Task) -> Outcome:
    """Non-private k-means (k-means++ seeding, 3 restarts, best SSE) on the raw records, using
    ``Task.rng``. No box, no noise: kind "none", ε = ∞."""
    centroids, _ = converged_kmeans(task.x, task.k, task.rng)
    return Outcome(centroids, math.inf, 0.0, task.neighbouring, "none")
