"""Platform-independent ``log`` and ``exp`` on float64 arrays, built from exact or correctly
rounded IEEE-754 operations only.

numpy's and libm's transcendental functions are not correctly rounded, and their SIMD and scalar
paths differ between CPUs, builds and versions, so the last bit of ``np.log(x)`` may change from one
machine to the next. Anything that must be bit-identical everywhere (the public frequencies Ω and
dither ξ, MECHANISMS §2.1) uses these functions instead. They use only elementwise ``+ − × ÷``
(correctly rounded), ``np.frexp``/``np.ldexp``/``np.rint`` (exact) and comparisons, in a fixed order
with no fused multiply-add, so the same input gives the same bits on every IEEE-754 platform.

They are not correctly rounded either: the error bounds are stated per function and checked against
numpy in ``tests/common/sketch/test_frequencies.py``. What matters is that the result is a fixed function of the
input bits.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

#: ln 2 split as in fdlibm: LN2_HI has 32 trailing zero bits, so e·LN2_HI is exact for |e| < 2^20.
LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_INV_LN2 = float.fromhex("0x1.71547652b82fep0")  # 1/ln 2, only used to pick k in exp
_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")  # √½ rounded; any nearby split point works
#: log: R = s²·Σ_{k≥1} 2 s^{2(k−1)}/(2k+1); |s| ≤ 0.1716, s² ≤ 0.0295, so 11 terms leave a
#: truncation error below 1e-19 relative.
_ATANH_COEFFS = tuple(2.0 / (2 * k + 1) for k in range(1, 12))
#: exp: Taylor coefficients 1/n! for n = 2..14 on |r| ≤ ln2/2 (truncation below 1e-19 relative).
_EXP_COEFFS = tuple(1.0 / math.factorial(n) for n in range(2, 15))
#: exp domain: |x| ≤ EXP_MAX keeps e^x a normal float64 (no overflow, no subnormal rounding).
EXP_MAX = 708.0


def log(x: ArrayLike) -> np.ndarray:
    """Natural logarithm ln x of finite x > 0 (float64, elementwise, any shape).

    Write x = (1 + f)·2^e with 1 + f ∈ [√½, √2) (``frexp``, exact), s = f/(2 + f), and
    ln x = e·ln 2 + 2·atanh(s), arranged as in fdlibm's ``__ieee754_log``:
    ln(1 + f) = f − (f²/2 − s·(f²/2 + R)), R = 2s²/3 + 2s⁴/5 + … (Horner in s²), and e·ln 2 added
    as e·LN2_HI (exact) + e·LN2_LO. Error below 1 ulp over the whole positive range,
    subnormals included (checked against a 50-digit reference in the tests).

    Raises ValueError if any element is ≤ 0, infinite or NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all((x > 0) & (x < np.inf)):
        raise ValueError("log needs finite x > 0")
    f, e = np.frexp(x)  # x = f·2^e, f ∈ [0.5, 1)
    low = f < _SQRT_HALF
    f = np.where(low, f + f, f) - 1.0  # exact: x = (1 + f)·2^e, 1 + f ∈ [√½, √2)
    e = (e - low).astype(np.float64)
    s = f / (2.0 + f)  # ln(1 + f) = 2·atanh(s) = f − s·f + s·R, s·f = f²/2 − s·f²/2
    z = s * s
    q = np.full_like(z, _ATANH_COEFFS[-1])
    for c in reversed(_ATANH_COEFFS[:-1]):
        q = q * z + c
    r = z * q
    hfsq = 0.5 * (f * f)
    return e * LN2_HI - ((hfsq - (s * (hfsq + r) + e * LN2_LO)) - f)


def exp(x: ArrayLike) -> np.ndarray:
    """Exponential e^x of |x| ≤ EXP_MAX = 708 (float64, elementwise, any shape).

    k = rint(x/ln 2), r = (x − k·LN2_HI) − k·LN2_LO ∈ [−0.347, 0.347] (Cody–Waite reduction,
    k·LN2_HI exact), e^r by its Taylor polynomial of degree 14 (Horner), and e^x = 2^k·e^r by
    ``ldexp`` (exact). Relative error below 2 ulp (measured ≤ 2.3e-16 on 10^6 random inputs).

    Raises ValueError if any element is outside [−708, 708] or NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.abs(x) <= EXP_MAX):
        raise ValueError(f"exp needs |x| <= {EXP_MAX:g}")
    k = np.rint(x * _INV_LN2)
    r = (x - k * LN2_HI) - k * LN2_LO
    p = np.full_like(r, _EXP_COEFFS[-1])
    for c in reversed(_EXP_COEFFS[:-1]):
        p = p * r + c
    p = 1.0 + (r + (r * r) * p)
    return np.ldexp(p, k.astype(np.int32))
