"""Differentially private subspace clustering (MECHANISMS §9; Wang, Wang, Singh, paper 001): the
subspace family of ``fedsketch compare``. :data:`METHODS` maps each CLI method name to its
mechanism, a function of a :class:`~fedsketch.server.bench.task.Task` returning an
:class:`~fedsketch.server.bench.task.Outcome`.

A clustering is k subspaces of dimension q of R^d, each given by an orthonormal basis; a set is an
array of bases (k, d, q). Every mechanism clips the rows to ``Task.norm_bound`` (refusing under
``Task.strict``) and works on x / norm_bound, so ‖x_i‖ ≤ 1 as the paper assumes; subspaces are
invariant to that scaling.

* :mod:`.geometry`: distances, costs, the public bound, scatter matrices;
* :mod:`.kplane`: ``kplane``, the non-private reference, and ``sulq-kplane``, k-plane with noisy
  scatter matrices (integer releases, exact discrete Gaussian noise; (ε, δ)-DP over all T·k
  queries by advanced composition);
* :mod:`.gibbs`: ``gibbs``, the exponential mechanism sampled by Gibbs from random subspaces
  (ε-DP only for exact samples);
* :mod:`.sample_aggregate`: ``sample-aggregate`` around TSC ((ε, δ)-DP for exact Gaussian noise,
  and only where Theorem 3.1's conditions hold; otherwise labelled without guarantee).

Noise: SuLQ's is exact integer noise from OS random bits; the Gibbs chain and sample-and-aggregate
sample in floating point from :mod:`.noise`'s ``noise_rng`` (a fresh OS-CSPRNG-seeded
generator), looked up there at each run, so that a test can seed them. ``Task.rng`` only seeds
non-private work (the reference's restarts, the data-independent starts of SuLQ and Gibbs).
"""

from __future__ import annotations

from collections.abc import Callable

from fedsketch.server.bench.subspace.geometry import (
    cluster_scatter,
    prepare,
    residuals,
    span_basis,
    subspace_cost,
    subspace_distance,
    wasserstein_distance,
)
from fedsketch.server.bench.subspace.gibbs import gibbs_assign, gibbs_chain, gibbs_subspace, gibbs_sweep
from fedsketch.server.bench.subspace.kplane import (
    kplane_fit,
    kplane_reference,
    kplane_solve,
    kplane_start,
    noisy_scatter,
    sulq_kplane,
    sulq_plan,
    sulq_sensitivity,
    sulq_step,
)
from fedsketch.server.bench.subspace.sample_aggregate import (
    canonical_vector,
    draw_subsets,
    neighbour_radii,
    projectors_to_bases,
    sample_aggregate,
    sample_aggregate_combine,
    smooth_bound,
    theorem_gap,
    tsc,
)
from fedsketch.server.bench.task import Outcome, Task

METHODS: dict[str, Callable[[Task], Outcome]] = {
    "kplane": kplane_reference,
    "sulq-kplane": sulq_kplane,
    "gibbs": gibbs_subspace,
    "sample-aggregate": sample_aggregate,
}

#: The registry and the names tests and benchmarks reach through the package.
__all__ = [
    "METHODS", "canonical_vector", "cluster_scatter", "draw_subsets", "gibbs_assign", "gibbs_chain",
    "gibbs_subspace", "gibbs_sweep", "kplane_fit", "kplane_reference", "kplane_solve", "kplane_start",
    "neighbour_radii", "noisy_scatter", "prepare", "projectors_to_bases", "residuals",
    "sample_aggregate", "sample_aggregate_combine", "smooth_bound", "span_basis", "subspace_cost",
    "subspace_distance", "sulq_kplane", "sulq_plan", "sulq_sensitivity", "sulq_step", "theorem_gap",
    "tsc", "wasserstein_distance",
]
