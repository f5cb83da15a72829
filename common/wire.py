"""Sketch payloads on the wire, and the coordinator's check that a payload is one the mechanism
could have produced.

Encodings (``Contribution.payload`` in ``proto/fedsketch.proto``):

* ``float32_pairs`` (``complex`` map): the normalized sketch s ∈ C^m as 2m little-endian float32,
  interleaved (Re s_1, Im s_1, Re s_2, …);
* ``int32_pairs`` (``quantized`` map): the noisy integer sum S~ ∈ Z^{2m} as 2m little-endian int32,
  interleaved the same way. The coordinator divides by α·N·√m after summing (MECHANISMS §1.5).

Magnitude bounds (DESIGN §6). A clean entry obeys |Re|, |Im| ≤ 1/(α√m) (normalized) or ≤ n
(integer). The noise is the study's plan (:func:`fedsketch.common.dp.plan.noise_plan`): Laplace
noise exceeds T·b with probability e^{−T}; T = 60 makes a false refusal (≈ 2m·1e-26) negligible;
Gaussian noise uses 12σ; discrete Laplace uses t + 1, t the radius of §1.5
(:func:`fedsketch.common.dp.calibration.noise_radius`: the smallest t with 2m·2a^{t+1}/(1+a) ≤
2^{−40}). Under add/remove the released count is itself noisy, so the true count is bounded by
count + T/ε₂, ε₂ the count's share of ε (:func:`fedsketch.common.dp.budget.add_remove_split`).
"""

from __future__ import annotations

import math

import numpy as np

from .dp.budget import add_remove_split
from .dp.calibration import noise_radius
from .dp.plan import noise_plan
from .privacy import PrivateSketch
from .study import StudySpec

KINDS: dict[str, str] = {"complex": "float32_pairs", "quantized": "int32_pairs"}
#: Laplace tail multiple and Gaussian σ multiple of the magnitude check.
LAPLACE_TAIL = 60.0
GAUSS_TAIL = 12.0
#: Relative slack for float32 rounding of the normalized sketch.
FLOAT32_SLACK = 1e-6
INT32_MAX = 2**31 - 1


class PayloadError(ValueError):
    """A payload the study's mechanism cannot have produced, or a malformed one."""


def encode(release: PrivateSketch, feature: str) -> tuple[str, bytes]:
    """(kind, bytes) of a release for the wire (module docstring)."""
    kind = KINDS[feature]
    m = release.sketch.size
    if kind == "float32_pairs":
        pairs = np.empty(2 * m, dtype="<f4")
        pairs[0::2] = release.sketch.real
        pairs[1::2] = release.sketch.imag
        return kind, pairs.tobytes()
    if release.payload is None:
        raise ValueError("a quantized release must carry its integer payload")
    if np.abs(release.payload).max() > INT32_MAX:
        raise ValueError("the integer sum does not fit int32: split the data over more devices")
    pairs = np.empty(2 * m, dtype="<i4")
    pairs[0::2] = release.payload[:m]
    pairs[1::2] = release.payload[m:]
    return kind, pairs.tobytes()


def decode(kind: str, data: bytes, m: int) -> np.ndarray:
    """The (2, m) array (re, im) of a payload: float64 for ``float32_pairs``, int64 otherwise."""
    dtype = {"float32_pairs": "<f4", "int32_pairs": "<i4"}.get(kind)
    if dtype is None:
        raise PayloadError(f"unknown payload kind {kind!r}")
    if len(data) != 8 * m:
        raise PayloadError(f"payload has {len(data)} bytes, the study needs 2m·4 = {8 * m}")
    pairs = np.frombuffer(data, dtype=dtype)
    out = np.stack([pairs[0::2], pairs[1::2]]).astype(np.float64 if kind == "float32_pairs"
                                                      else np.int64)
    if kind == "float32_pairs" and not np.all(np.isfinite(out)):
        raise PayloadError("payload has NaN or inf entries")
    return out


def check_count(spec: StudySpec, n: float) -> None:
    """Refuse a record count the study cannot accept (PayloadError with the reason)."""
    if not math.isfinite(n):
        raise PayloadError(f"record count must be finite, got {n}")
    if spec.sketch.privacy.neighbouring == "replace_one":
        if n != int(n) or n < spec.min_records:
            raise PayloadError(f"record count must be an integer >= {spec.min_records} "
                               f"(replace-one, n public), got {n}")


def max_abs_entry(spec: StudySpec, n: float) -> float:
    """The largest |Re| or |Im| of a payload entry that the study's mechanism can produce.

    Payload units: normalized sketch (float payloads) or integer sum (integer payloads); ``n`` is
    the contribution's record count as sent (module docstring).
    """
    privacy = spec.sketch.privacy
    m, r, feature = spec.sketch.frequencies.m, spec.sketch.r, spec.sketch.feature
    alpha = r / m
    term = noise_plan(feature, m, r, privacy, n)[0]  # the noise on the 2m coordinates
    replace_one = privacy.neighbouring == "replace_one"
    if replace_one:
        count_hi = n
    else:
        count_hi = max(n, 0.0) + LAPLACE_TAIL / add_remove_split(privacy.epsilon, m)[1]
    if term.law == "discrete_laplace":
        return count_hi + (noise_radius(term.scale, 2 * m) + 1)
    tail = (GAUSS_TAIL if term.law == "gaussian" else LAPLACE_TAIL) * term.scale
    if replace_one:
        return (1.0 / (alpha * math.sqrt(m)) + tail) * (1 + FLOAT32_SLACK)
    bound = count_hi / (alpha * math.sqrt(m)) + tail
    return bound / max(n, 1.0) * (1 + FLOAT32_SLACK)


def check_payload(spec: StudySpec, kind: str, data: bytes, n: float) -> np.ndarray:
    """Decode and validate a contribution's payload; returns :func:`decode`'s (2, m) array."""
    expected = KINDS[spec.sketch.feature]
    if kind != expected:
        raise PayloadError(f"the study's {spec.sketch.feature} map travels as {expected}, "
                           f"got {kind}")
    check_count(spec, n)
    values = decode(kind, data, spec.sketch.frequencies.m)
    bound = max_abs_entry(spec, n)
    worst = float(np.abs(values).max())
    if worst > bound:
        raise PayloadError(f"payload entry {worst:.6g} exceeds {bound:.6g}, the largest value "
                           "the study's mechanism can produce")
    return values
