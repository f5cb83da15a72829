"""The constants of the fused r = m kernel (:mod:`fedsketch.common.sketch.trig_kernel` states
their use): float32 Cody–Waite parts of π/2 and Cephes' ``sinf``/``cosf`` coefficients, shared by
the compiled loop and its numpy specification without an import cycle."""

from __future__ import annotations

import math

import numpy as np

_F = np.float32
#: Rows summed in float32 before the sums move to float64: |Σ| ≤ 2^13·1024 = 2^23 < 2^24.
FLUSH_ROWS = 1 << 13
#: A record whose phase bound reaches this (radians) takes the float64 slow path (trig_kernel, step 2).
FAST_LIMIT = 8192.0

CONSTANTS = {
    "TWO_OVER_PI": _F(2.0 / math.pi),
    "MAGIC": _F(12582912.0),  # 1.5·2^23: v + M − M rounds v half to even for |v| < 2^22
    "P1": _F(1.5703125), "P2": _F(4.837512969970703125e-4), "P3": _F(7.54978995489188216e-8),
    "S1": _F(-1.6666654611e-1), "S2": _F(8.3321608736e-3), "S3": _F(-1.9515295891e-4),
    "C1": _F(4.166664568298827e-2), "C2": _F(-1.388731625493765e-3),
    "C3": _F(2.443315711809948e-5), "HALF": _F(0.5), "ONE": _F(1.0), "FAST_LIMIT": FAST_LIMIT,
    "FLUSH_ROWS": FLUSH_ROWS,
}
