"""The public box [lo, hi]^d (data units) every record is mapped into before it is sketched.

Privacy needs every record's feature to be bounded (|Re q| + |Im q| ≤ κ grid steps), which
holds for every finite phase t = Ωᵀx + ξ. A finite float32 record such as (1e38, 0) can
overflow the float32 product Ωᵀx to ±inf, and cos(±inf) is NaN. So, before sketching, each
record is

* **clipped** into the box: x ↦ min(max(x, lo), hi) per coordinate, in the file's own dtype
  (a float64 value beyond the float32 range is clipped before it is narrowed); the number of
  records moved is counted locally (:class:`Tally`) and never sent; and
* **centred**: the kernel sketches x − c, c = (lo + hi)/2, with the dither replaced by
  ξ' = (ξ + Ωᵀc) mod 2π (computed in float64). Since Ωᵀx + ξ = Ωᵀ(x − c) + Ωᵀc + ξ and f is
  2π-periodic, the sketch is the same; the float32 phases then stay within
  B = max_k Σ_j |Ω_jk|·(hi_j − lo_j)/2 radians of ξ', however far the box lies from 0.

:meth:`Box.reduce` refuses frequencies for which B ≥ :data:`PHASE_LIMIT`, so no finite record
can produce a non-finite phase. NaN and ±inf are not records: the readers of
:mod:`fedsketch.common.data.dataio` refuse them, naming the row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

#: Largest phase bound B (radians) accepted: float32 phases stay finite (their range ends near
#: 2^128) and the quantized map's quadrant ⌊t·2/π⌋ fits an int64.
PHASE_LIMIT = 2.0**62
#: Half-width of :meth:`Box.widest`, the box used when nobody states one (data units).
WIDEST = 2.0**40


@dataclass
class Tally:
    """What clipping did in one pass: ``records`` read and ``clipped`` (records with at least one
    coordinate moved onto the box). Local to the device: never sent, never stored in a release."""

    records: int = 0
    clipped: int = 0


@dataclass(frozen=True)
class Reduced:
    """Frequencies for centred records: Ω (d, m) in 1/data units, ξ' = (ξ + Ωᵀc) mod 2π (m,)."""

    omega: np.ndarray
    xi: np.ndarray


@dataclass(frozen=True)
class Box:
    """[lo, hi]^d in data units; ``lo`` and ``hi`` are float64 (d,) with lo < hi, all finite."""

    lo: np.ndarray
    hi: np.ndarray
    center: np.ndarray = field(init=False, repr=False)
    _shifted: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lo = np.atleast_1d(np.asarray(self.lo, dtype=np.float64)).copy()
        hi = np.atleast_1d(np.asarray(self.hi, dtype=np.float64)).copy()
        if lo.shape != hi.shape or lo.ndim != 1:
            raise ValueError(f"a box needs lo and hi of one length d, got {lo.shape} and {hi.shape}")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError("a box needs finite lo and hi")
        if np.any(lo >= hi):
            axis = int(np.argmax(lo >= hi))
            raise ValueError(f"a box needs lo < hi on every axis; axis {axis} has "
                             f"{lo[axis]:g} ≥ {hi[axis]:g}")
        for name, value in (("lo", lo), ("hi", hi), ("center", lo / 2.0 + hi / 2.0)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_shifted", bool(np.any(self.center != 0.0)))

    @classmethod
    def widest(cls, d: int) -> Box:
        """[−2^40, 2^40]^d: the box of a sketch whose owner states none (every plausible record
        lies inside; it only keeps phases finite)."""
        return cls(np.full(d, -WIDEST), np.full(d, WIDEST))

    @property
    def d(self) -> int:
        """The dimension."""
        return self.lo.shape[0]

    @property
    def half(self) -> np.ndarray:
        """h = hi/2 − lo/2 (d,), data units: a centred record's coordinate l lies in [−h_l, h_l]
        (halved first, so a box of extreme finite bounds does not overflow)."""
        return self.hi / 2.0 - self.lo / 2.0

    def phase_bound(self, omega: np.ndarray) -> float:
        """B = max_k Σ_j |Ω_jk|·(hi_j − lo_j)/2 (radians): the largest |Ωᵀ(x − c)| in the box; inf
        if a half-width exceeds the float32 range (the kernel could not hold x − c)."""
        half = self.half
        if np.any(half > np.finfo(np.float32).max):
            return math.inf
        return float(np.max(np.abs(np.asarray(omega, dtype=np.float64)).T @ half))

    def reduce(self, freqs) -> Reduced:
        """The frequencies to sketch centred records with (module docstring). ValueError if the
        box and Ω (d, m) disagree on d, or if the phase bound B reaches :data:`PHASE_LIMIT`."""
        omega = np.asarray(freqs.omega, dtype=np.float64)
        if omega.shape[0] != self.d:
            raise ValueError(f"the box has d = {self.d}, the frequencies d = {omega.shape[0]}")
        bound = self.phase_bound(omega)
        if not bound < PHASE_LIMIT:
            raise ValueError(f"the box is too wide for these frequencies: phases could reach "
                             f"{bound:.3g} rad (limit {PHASE_LIMIT:.3g}); state a tighter box")
        # finite: |c_j| < 2^54·half_j (lo < hi in float64), so |Ωᵀc| < 2^54·B < 2^116
        xi = np.mod(np.asarray(freqs.xi, dtype=np.float64) + omega.T @ self.center, 2.0 * math.pi)
        return Reduced(freqs.omega, xi)

    def outside(self, chunk: np.ndarray) -> np.ndarray:
        """Boolean (rows,): which records have a coordinate outside [lo, hi]."""
        return np.any((chunk < self.lo) | (chunk > self.hi), axis=1)

    def centred(self, chunks: Iterable[np.ndarray], tally: Tally | None = None) -> Iterator[np.ndarray]:
        """Each chunk (rows, d) of finite records, any real dtype, clipped into the box and
        shifted by −c, as float32; the counts go to ``tally``."""
        for chunk in chunks:
            if chunk.ndim != 2 or chunk.shape[1] != self.d:
                raise ValueError(f"records have dimension {chunk.shape[-1]}, the box has {self.d}")
            moved = self.outside(chunk)
            clipped = int(moved.sum())
            if tally is not None:
                tally.records += chunk.shape[0]
                tally.clipped += clipped
            if not clipped and not self._shifted and chunk.dtype == np.float32:
                yield chunk  # already inside a box centred at 0: nothing to do
                continue
            x = np.asarray(chunk, dtype=np.float64)
            if clipped:
                x = np.clip(x, self.lo, self.hi)
            yield (x - self.center).astype(np.float32)
