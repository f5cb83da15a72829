"""Feature maps f applied to the phases t = Ωᵀx + ξ (radians), and their constants.

``complex``:   f(t) = e^{it}.
``quantized``: f_q(t) = sign(cos t) + i·sign(sin t), by the quadrant rule on t mod 2π:
               [0, π/2) → 1+i, [π/2, π) → −1+i, [π, 3π/2) → −1−i, [3π/2, 2π) → 1−i.
Features are normalized by 1/√m in the sketch; that factor lives in the sketching code.

Integer encoding (MECHANISMS §1.10). Every release is an integer vector: a record's feature f(t)
is encoded on the public grid of γ = ``GRID[feature]`` steps per unit as
q(t) = round(γ·Re f(t)) + i·round(γ·Im f(t)), and the device sums the q of its records. For
``quantized`` γ = 1 and q = f_q (already ±1 ± i). For ``complex`` γ = 1024: rounding moves a
record's feature by at most 1/(2γ) ≈ 5·10⁻⁴ per part (before the 1/√m), far below the noise of
any finite ε. ``ENTRY_L1`` is κ_γ, a bound on |Re q| + |Im q| of one encoded entry, and
``ENTRY_L2`` a bound on its modulus |q|, both in grid steps; the integer sensitivities
(:mod:`fedsketch.common.dp.calibration`) are built from them.

c_f = 2·max_t(|Re f(t)| + |Im f(t)|) is the per-entry L1 bound on a replace-one change
(2√2 for ``complex``, 4 for ``quantized``). The decoder's atoms use the first harmonic of f:
e^{it} for ``complex`` and (4/π)·e^{it} for ``quantized`` (MECHANISMS §1.1, §1.4).
"""

from __future__ import annotations

import math

import numpy as np

from .choices import FEATURES

#: c_f: twice the largest |Re f| + |Im f| (dimensionless).
C_F: dict[str, float] = {"complex": 2.0 * math.sqrt(2.0), "quantized": 4.0}

#: Largest per-entry change |f(t) − f(t')| in modulus, used by the L2 sensitivities (§1.6).
MAX_ENTRY_CHANGE: dict[str, float] = {"complex": 2.0, "quantized": 2.0 * math.sqrt(2.0)}

#: γ: the coefficient of e^{it} in the Fourier series of f (decoder atoms are γ·e^{it}/√m).
FIRST_HARMONIC: dict[str, float] = {"complex": 1.0, "quantized": 4.0 / math.pi}


#: γ: grid steps per unit of Re f and Im f in the integer encoding (a public constant).
GRID: dict[str, int] = {"complex": 1024, "quantized": 1}

#: κ_γ ≥ max_t |round(γ cos t)| + |round(γ sin t)| (grid steps). For ``complex``
#: ⌊γ(√2 + 2⁻¹⁰)⌋ + 1 = 1450 (the exact maximum over the circle is 1449): the slack covers any
#: error of the float32 cos and sin up to 2⁻¹⁰, far beyond their few-ulp accuracy. ``quantized``: 2.
ENTRY_L1: dict[str, int] = {
    "complex": math.floor(GRID["complex"] * (math.sqrt(2.0) + 2.0**-10)) + 1,
    "quantized": 2,
}

#: Bound on the modulus |q| of one encoded entry (grid steps): γ(1 + 2⁻¹⁰) + √2/2 for
#: ``complex`` (rounding moves each part by ≤ 1/2), √2 for ``quantized``.
ENTRY_L2: dict[str, float] = {
    "complex": GRID["complex"] * (1.0 + 2.0**-10) + math.sqrt(0.5),
    "quantized": math.sqrt(2.0),
}


def check_feature(feature: str) -> str:
    """Return ``feature`` if it is a known map, else raise ValueError naming the choices."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature map {feature!r}; choose one of {', '.join(FEATURES)}")
    return feature


_TWO_OVER_PI = np.float32(2.0 / math.pi)


def quadrant_signs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signs (Re, Im) of f_q(t) as int64 arrays of ±1, by the quadrant of t mod 2π.

    No trigonometry: with q = ⌊t·2/π⌋ mod 4, Re < 0 iff bit 1 of q+1 is set (q ∈ {1, 2}) and
    Im < 0 iff bit 1 of q is set (q ∈ {2, 3}); each sign is 1 − that bit (worth 2). q is taken
    in int64, exact for |t| < 2^63·π/2 (:data:`fedsketch.common.sketch.box.PHASE_LIMIT` keeps every
    phase below 2^62 rad).
    """
    q = np.floor(t * _TWO_OVER_PI).astype(np.int64)
    return 1 - ((q + 1) & 2), 1 - (q & 2)
