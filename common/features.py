"""Feature maps f applied to the phases t = Ωᵀx + ξ (radians), and their constants.

``complex``:   f(t) = e^{it}.
``quantized``: f_q(t) = sign(cos t) + i·sign(sin t), by the quadrant rule on t mod 2π:
               [0, π/2) → 1+i, [π/2, π) → −1+i, [π, 3π/2) → −1−i, [3π/2, 2π) → 1−i.
Features are normalized by 1/√m in the sketch; that factor lives in the sketching code.

c_f = 2·max_t(|Re f(t)| + |Im f(t)|) is the per-entry L1 bound on a replace-one change
(2√2 for ``complex``, 4 for ``quantized``). The decoder's atoms use the first harmonic of f:
e^{it} for ``complex`` and (4/π)·e^{it} for ``quantized`` (MECHANISMS §1.1, §1.4).
"""

from __future__ import annotations

import math

import numpy as np

FEATURES: tuple[str, ...] = ("complex", "quantized")

#: c_f: twice the largest |Re f| + |Im f| (dimensionless).
C_F: dict[str, float] = {"complex": 2.0 * math.sqrt(2.0), "quantized": 4.0}

#: Largest per-entry change |f(t) − f(t')| in modulus, used by the L2 sensitivities (§1.6).
MAX_ENTRY_CHANGE: dict[str, float] = {"complex": 2.0, "quantized": 2.0 * math.sqrt(2.0)}

#: γ: the coefficient of e^{it} in the Fourier series of f (decoder atoms are γ·e^{it}/√m).
FIRST_HARMONIC: dict[str, float] = {"complex": 1.0, "quantized": 4.0 / math.pi}


def check_feature(feature: str) -> str:
    """Return ``feature`` if it is a known map, else raise ValueError naming the choices."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature map {feature!r}; choose one of {', '.join(FEATURES)}")
    return feature


_TWO_OVER_PI = np.float32(2.0 / math.pi)


def quadrant_signs(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signs (Re, Im) of f_q(t) as int32 arrays of ±1, by the quadrant of t mod 2π.

    No trigonometry: with q = ⌊t·2/π⌋ mod 4, Re < 0 iff bit 1 of q+1 is set (q ∈ {1, 2}) and
    Im < 0 iff bit 1 of q is set (q ∈ {2, 3}); each sign is 1 − that bit (worth 2).
    """
    q = np.floor(t * _TWO_OVER_PI).astype(np.int32)
    return 1 - ((q + 1) & 2), 1 - (q & 2)
