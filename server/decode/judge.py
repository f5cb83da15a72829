"""The verdict on published centroids (:mod:`fedsketch.common.study.verdict`) from what a run
released: a sketch with its public noise level, or a study's last refinement round.

The sketch's fit: r = s − A·p with A the published centroids' unit atoms u(c) = e^{i(Ωᵀc + ξ)}/√m
stacked as 2m real rows and p ≥ 0 their non-negative least-squares weights; ‖e‖² = 2m·v the
expected squared norm of the sketch's noise, v per real coordinate
(:func:`fedsketch.common.study.planner.noise_variance`). All in sketch units.
"""

from __future__ import annotations

import math

import numpy as np

from fedsketch.common.sketch.frequencies import draw_frequencies
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.verdict import LastStep, SketchFit, Verdict, judge
from fedsketch.server.decode.clompr import stacked_atoms


def sketch_fit(sketch: np.ndarray, spec: SketchSpec, centroids: np.ndarray, variance: float) -> SketchFit:
    """:class:`SketchFit` of ``centroids`` (k, d) on ``sketch`` (complex (m,)) whose noise has
    ``variance`` v per real coordinate (module docstring)."""
    from scipy.optimize import nnls  # here, not at the top: the coordinator imports this at start-up

    freqs = draw_frequencies(spec.frequencies)
    m = spec.frequencies.m
    s = np.concatenate([np.real(sketch), np.imag(sketch)]).astype(np.float64)
    atoms = stacked_atoms(np.asarray(centroids, dtype=np.float64), freqs.omega, freqs.xi, 1.0 / math.sqrt(m))
    p, residual = nnls(atoms, s)
    return SketchFit(float(s @ s), float(residual) ** 2, 2.0 * m * max(variance, 0.0))


def judge_sketch(sketch: np.ndarray, spec: SketchSpec, centroids: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray, variance: float, identifiability: dict | None = None) -> Verdict:
    """The verdict on ``centroids`` published from ``sketch`` alone (no refinement rounds)."""
    half = (np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float)) / 2.0
    return judge(centroids, half, fit=sketch_fit(sketch, spec, centroids, variance),
                 identifiability=identifiability)


def judge_step(centroids: np.ndarray, lo: np.ndarray, hi: np.ndarray, step: LastStep,
               identifiability: dict | None = None, cells: LastStep | None = None) -> Verdict:
    """The verdict on ``centroids`` published after a noisy Lloyd step ``step`` (``cells``: an
    earlier over-seeded step's release, whose cells show the clusters' spread)."""
    half = (np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float)) / 2.0
    return judge(centroids, half, step=step, cells=cells, identifiability=identifiability)
