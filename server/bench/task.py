"""What every centralized mechanism of ``fedsketch compare`` takes and returns.

A trusted curator holds all records; each mechanism (k-means, PCA, subspace clustering; see
:mod:`fedsketch.server.bench.kmeans`, :mod:`fedsketch.server.bench.pca`,
:mod:`fedsketch.server.bench.subspace`) reads a :class:`Task` and returns an :class:`Outcome` that
states what it spent, under which neighbouring relation, and what kind of guarantee it gives.
(:class:`Outcome` is a mechanism's release; ``fedsketch.client.study_pass.Outcome``, what a device's
pass over its open studies did, is unrelated.) Privacy noise and the randomness of
exponential-mechanism samplers come from :func:`fedsketch.common.dp.samplers.noise_rng` (the OS
CSPRNG); ``Task.rng`` is only for randomness that is not part of a privacy proof (a non-private
reference's restarts, the data-independent initialization of a public-seeded method).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedsketch.common.dp.calibration import check_epsilon
from fedsketch.common.study.verdict import Verdict

#: Kinds of guarantee (MECHANISMS §0.6), each with the words ``fedsketch compare`` shows for it:
#: ``none`` (a non-private reference, a data-independent floor, or a mechanism run outside the
#: conditions of its theorem), ``pure`` ε-DP and ``approximate`` (ε, δ)-DP (integer releases
#: with exact noise), ``local-sensitivity`` (noise calibrated to the given data: no worst-case
#: guarantee), ``exact-sampling`` ((ε, δ)-DP if its float noise were exactly Gaussian) and
#: ``asymptotic-mcmc`` (ε-DP for exact samples; a finite chain of float draws gives no formal
#: guarantee).
GUARANTEES: dict[str, str] = {
    "none": "no privacy guarantee",
    "pure": "pure ε-DP",
    "approximate": "(ε, δ)-DP",
    "local-sensitivity": "local sensitivity only, not DP",
    "exact-sampling": "(ε, δ)-DP only if its float noise were exact",
    "asymptotic-mcmc": "ε-DP only for exact samples (finite MCMC chain)",
}
KINDS = tuple(GUARANTEES)


@dataclass(frozen=True)
class Task:
    """One run of one mechanism on one dataset.

    ``x`` (n, d) records; ``k`` clusters (k-means, subspace clustering) or the PCA rank;
    ``epsilon`` (∞ only for non-private references) and ``delta`` (used by approximate
    mechanisms); ``lo``/``hi`` the public box (data units) for k-means; ``norm_bound`` the public
    bound on ‖x‖₂ for PCA and subspace clustering; ``q`` the subspace dimension;
    ``neighbouring`` 'add_remove' or 'replace_one'; ``strict`` refuses (ValueError) rows outside
    the public bound instead of clipping them. ``public_records``: a record count already released
    (or public) that a mechanism may use instead of releasing its own, e.g. to plan a sketch's size
    and Su's T (None: each mechanism uses n under replace-one and releases a noisy n under
    add/remove, as it states).
    """

    x: np.ndarray
    k: int
    epsilon: float
    delta: float = 1e-6
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    norm_bound: float = 1.0
    q: int = 1
    neighbouring: str = "replace_one"
    strict: bool = False
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    public_records: float | None = None

    def __post_init__(self) -> None:
        """Refuse an inconsistent task (shapes, non-finite records, k, ε, δ, relation, bounds) with
        ValueError."""
        if self.x.ndim != 2 or self.x.shape[0] < 1:
            raise ValueError(f"x must be a non-empty (n, d) array, got shape {self.x.shape}")
        if not np.all(np.isfinite(self.x)):
            raise ValueError("x holds a value that is not finite (NaN or infinity): no public "
                             "bound can hold it")
        if not 1 <= self.k <= self.x.shape[0]:
            raise ValueError(f"k must be in 1..n = 1..{self.x.shape[0]}, got {self.k}")
        check_epsilon(self.epsilon)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.neighbouring not in ("add_remove", "replace_one"):
            raise ValueError(f"unknown neighbouring relation {self.neighbouring!r}")
        if not (math.isfinite(self.norm_bound) and self.norm_bound > 0):
            raise ValueError(f"norm_bound must be finite and > 0, got {self.norm_bound}")
        if (self.lo is None) != (self.hi is None):
            raise ValueError("give both lo and hi, or neither")
        if self.lo is not None and not np.all(np.asarray(self.lo) < np.asarray(self.hi)):
            raise ValueError("the box needs lo < hi on every axis")

    @property
    def d(self) -> int:
        """The record dimension d (columns of ``x``)."""
        return self.x.shape[1]


@dataclass(frozen=True)
class Outcome:
    """A mechanism's release and its accounting (not the device agent's
    ``fedsketch.client.study_pass.Outcome``).

    ``output``: centroids (k, d) for k-means; an orthonormal basis (d, k) for PCA; bases
    (k, d, q) for subspace clustering. ``epsilon``/``delta`` actually spent, ``kind`` one of
    :data:`KINDS`. ``clipped``, the number of rows moved onto the public bound, is a non-private
    operator diagnostic (the curator's own count, never part of a release). ``notes`` is free
    text or JSON about the run; values computed from the records without noise sit under the
    JSON key ``"non_private"`` or say "non-private" in the text. ``status`` is a sketch
    decoding's verdict against the sketch's public noise level ("identified" or "not
    identifiable", :mod:`fedsketch.server.decode.identify`), empty for mechanisms without one.
    ``verdict`` is the verdict on the centroids returned (:mod:`fedsketch.common.study.verdict`),
    from what the mechanism released; None for a mechanism that releases nothing to judge them by.
    """

    output: np.ndarray
    epsilon: float
    delta: float
    neighbouring: str
    kind: str
    clipped: int = 0
    notes: str = ""
    status: str = ""
    verdict: Verdict | None = None

    def __post_init__(self) -> None:
        """Refuse a kind of guarantee outside :data:`KINDS`."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}")

    @property
    def guarantee(self) -> str:
        """The guarantee in words (:data:`GUARANTEES`)."""
        return GUARANTEES[self.kind]


def clip_rows_to_norm(x: np.ndarray, bound: float, strict: bool) -> tuple[np.ndarray, int]:
    """Rows scaled onto the ball ‖x‖₂ ≤ bound; (clipped data, count). ``strict`` refuses."""
    norms = np.linalg.norm(x, axis=1)
    over = norms > bound
    count = int(over.sum())
    if count and strict:
        raise ValueError(f"{count} rows exceed the public norm bound {bound:g} (--strict; the count "
                         "is a non-private operator diagnostic)")
    if not count:
        return x, 0
    out = x.copy()
    out[over] *= (bound / norms[over])[:, None]
    return out, count


def require_finite_epsilon(task: Task, name: str, reference: str) -> None:
    """Refuse ε = ∞ for the private method ``name``: it gives no privacy, and the family's
    non-private ``reference`` method is what ε = ∞ means."""
    if math.isinf(task.epsilon):
        raise ValueError(f"{name} needs a finite epsilon; epsilon = inf gives no privacy: use the "
                         f"non-private '{reference}' reference")


def clip_rows_to_box(x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     strict: bool) -> tuple[np.ndarray, int]:
    """Records clipped into [lo, hi]; (clipped data, rows changed). ``strict`` refuses."""
    outside = np.any((x < lo) | (x > hi), axis=1)
    count = int(outside.sum())
    if count and strict:
        raise ValueError(f"{count} rows lie outside the public box (--strict; the count is a "
                         "non-private operator diagnostic)")
    return (np.clip(x, lo, hi) if count else x), count


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
