"""Integer releases on a public grid: how every centralized mechanism adds its noise
(MECHANISMS §1.9 item 7; the sketch's own grid is §1.10).

Float noise added to a float query leaks: with numpy's sampler, releases from a dataset can be
impossible under its neighbour (Mironov 2012), so ε = ∞ whatever the scale. A mechanism that
adds noise to a bounded real query therefore releases instead

    T~ = rint(v/g) + Z ∈ Z^D,

with v either a sum Σ_i v(x_i) of per-record values each rounded on its own (cluster counts and
sums, scatter matrices), or one whole-dataset value (a whitened centroid); g > 0 a public step
in the units of v, chosen from public bounds only; Z an exact integer law read from OS random
bits (:func:`~fedsketch.common.dp.samplers.dlap_noise`,
:func:`~fedsketch.common.dp.samplers.dgauss_noise`). What the mechanism then computes from g·T~
is post-processing. The law of T~ depends on the data only through the integer rint(v/g), so
two neighbours whose encoded queries are within the sensitivity below can produce exactly the
same releases.

**Steps.** g = B/STEPS for a public bound B of |v| per coordinate (data units, or the units of
the query), STEPS = 2^20: an encoded value lies in [−STEPS, STEPS] and the rounding error of a
mean is at most g/2 = B·2^−21, far below any noise a mechanism adds.

**Sensitivity in steps, rounding included** (:func:`l2_in_steps`). If neighbours change v by at
most Δ2 in L2 (units of v), the encoded query moves by at most Δ2/g + √D when both sides are
rounded (a replaced record: its old and new encodings; a whole-dataset query), because each of
the D coordinates' two rounding errors differ by less than 1 step; and by Δ2/g + √D/2 when one
record's encoding is added or removed (its one rounding error is at most 1/2). Both are raised by
the relative FLOAT_MARGIN, which covers the float arithmetic that computes v/g from v: its
relative error is below 2^−50, so below 1/16 of a step for |v/g| ≤ MAX_STEPS, against a margin of
about one step. (The margin covers rounding v/g, not the float error in computing v itself: that
is exact enough for the per-record products here, but a whitened centroid Σ^{−1/2}c of an
ill-conditioned Σ can carry more, which is one more reason the white and colored mechanisms are
labelled local-sensitivity.) With per-coordinate bounds and g_l = B_l/STEPS, the L1 sensitivity
of a count or a coordinate sum under add/remove is exactly 1 or STEPS (an encoded coordinate is
clipped to ±STEPS), with no rounding slack.

Units: a step is in the units of the encoded query; sensitivities and σ in steps; ε
dimensionless, δ a probability.
"""

from __future__ import annotations

import math

import numpy as np

#: Steps per public bound B: g = B/STEPS; encoded values lie in [−STEPS, STEPS].
STEPS = 1 << 20
#: Largest number of encoded values a release may sum: |Σ| ≤ rows·STEPS stays below 2^53, so a
#: float64 accumulation (``np.bincount`` in :mod:`fedsketch.common.dp.lloyd`) is exact, and int64
#: sums (:func:`outer_sum`) keep room for the noise.
MAX_ROWS = 1 << 32
#: Largest |v/g| of a whole-dataset query (:func:`encode` with ``limit=None``), and the relative
#: margin on an L2 sensitivity in steps for the float arithmetic of v/g (module docstring).
MAX_STEPS = 1 << 46
FLOAT_MARGIN = 2.0**-20
#: Encoded entries per block of :func:`outer_sum` (bounds its scratch array to 32 MiB).
BLOCK = 1 << 22


def step(bound: float | np.ndarray) -> float | np.ndarray:
    """g = B/STEPS for a public bound B > 0 of |v| (units of v; a power-of-two scaling, exact)."""
    b = np.asarray(bound, dtype=np.float64)
    if not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"a grid bound must be finite and > 0, got {bound}")
    return b / STEPS if b.ndim else float(b) / STEPS


def encode(values: np.ndarray, step_size: float | np.ndarray, limit: int | None = STEPS) -> np.ndarray:
    """int64 rint(values/g); ``step_size`` broadcasts against ``values``.

    ``limit`` = STEPS: values within a public bound ±B = ±g·STEPS, clipped to [−STEPS, STEPS]
    (the clip makes the bound exact whatever the value). ``limit`` = None: a whole-dataset query
    without a per-coordinate bound; ValueError if some |v/g| exceeds MAX_STEPS (beyond it the
    float quotient's error is no longer a small fraction of a step). A value that is not finite
    is a ValueError on both paths (its integer would be arbitrary).
    """
    q = np.rint(np.asarray(values, dtype=np.float64) / step_size)
    if not np.all(np.isfinite(q)):
        raise ValueError("a value to encode on the grid is not finite (NaN or infinity): the "
                         "records must be finite")
    if limit is not None:
        return np.clip(q, -limit, limit).astype(np.int64)
    if not np.all(np.abs(q) <= MAX_STEPS):
        raise ValueError(f"a value lies beyond {MAX_STEPS} grid steps: the query is too large "
                         "against its sensitivity for an integer release")
    return q.astype(np.int64)


def check_rows(rows: int) -> None:
    """Refuse a sum of more than MAX_ROWS encoded records (its integers would leave float64's
    exact range)."""
    if rows > MAX_ROWS:
        raise ValueError(f"an integer release sums at most {MAX_ROWS} records, got {rows}")


def outer_sum(x: np.ndarray, step_size: float) -> np.ndarray:
    """Σ_i rint(x_i x_iᵀ/g) (d, d) int64, each record's outer product encoded on its own, for
    records with ‖x_i‖ ≤ B (so |entries| ≤ B² and g = B²/STEPS keeps them within ±STEPS); in
    blocks of at most BLOCK encoded entries."""
    n, d = x.shape
    check_rows(n)
    total = np.zeros((d, d), dtype=np.int64)
    rows = max(1, BLOCK // (d * d))
    for s in range(0, n, rows):
        xb = x[s:s + rows]
        total += encode(xb[:, :, None] * xb[:, None, :], step_size).sum(axis=0)
    return total


def l2_in_steps(delta2: float, step_size: float, coordinates: int, both_rounded: bool) -> float:
    """L2 sensitivity in steps of an encoded query of ``coordinates`` values whose neighbours
    differ by at most ``delta2`` (units of the query): (Δ2/g + √D)·(1 + FLOAT_MARGIN) if both
    neighbours' values are rounded (replace-one, a whole-dataset query), (Δ2/g + √D/2)·(1 +
    FLOAT_MARGIN) if one record's encoding is added or removed (module docstring)."""
    slack = math.sqrt(coordinates) * (1.0 if both_rounded else 0.5)
    return (delta2 / step_size + slack) * (1.0 + FLOAT_MARGIN)
