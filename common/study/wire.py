"""Sketch payloads on the wire, and the coordinator's check that a payload is one the mechanism
could have produced.

A payload is the noisy encoded sum S~ ∈ Z^{2m} in grid steps (:mod:`fedsketch.common.sketch.privacy`),
interleaved (Re S~_1, Im S~_1, Re S~_2, …) in little-endian integers (``Contribution.payload`` in
``proto/fedsketch.proto``): ``int64_pairs`` for the ``complex`` map (γ = 1024 steps per unit, so
|S| reaches 1024·n) and ``int32_pairs`` for ``quantized`` (γ = 1). The grid γ is public, fixed
by the feature map (:data:`fedsketch.common.features.GRID`); the record count travels as an
integer-valued double. The coordinator sums the integers and divides by γ·α·N·√m
(MECHANISMS §1.8, §1.10).

Magnitude bounds (DESIGN §6). A clean entry obeys |Re|, |Im| ≤ γ·n. The noise is the study's
plan (:func:`fedsketch.common.dp.plan.noise_plan`): discrete Laplace uses t + 1, t the radius of
§1.5 (:func:`fedsketch.common.dp.calibration.noise_radius`: the smallest t with
2m·2a^{t+1}/(1+a) ≤ 2^{−40}); the discrete Gaussian, σ²-subgaussian (CKS 2020), uses 12σ
(2m·2e^{−72} is negligible). Under add/remove the released count is itself noisy, so the true
count is bounded by the count plus the radius of its DLap term. Every study caps the records
one device may hold (``StudySpec.max_device_records``): a device with more refuses the study,
so no count, and no payload, may claim more (plus the count's noise under add/remove).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..dp.calibration import noise_radius
from ..dp.plan import noise_plan
from ..features import GRID
from ..sketch.privacy import PrivateSketch

if TYPE_CHECKING:  # annotations only: the study module imports this one's MAX_RECORDS
    from .study import StudySpec

KINDS: dict[str, str] = {"complex": "int64_pairs", "quantized": "int32_pairs"}
_DTYPES: dict[str, str] = {"int64_pairs": "<i8", "int32_pairs": "<i4"}
#: The discrete Gaussian's σ multiple of the magnitude check.
GAUSS_TAIL = 12.0
#: The largest record count one device may claim (2^40 ≈ 1.1·10^12), and the cap of a study
#: stored before studies declared ``max_device_records``: its payload entries then stay below
#: 2^51 grid steps, so 4,096 such devices still sum exactly in int64.
MAX_RECORDS = 2**40


class PayloadError(ValueError):
    """A payload the study's mechanism cannot have produced, or a malformed one."""


def encode(release: PrivateSketch, feature: str) -> tuple[str, bytes]:
    """(kind, bytes) of a release for the wire (module docstring)."""
    kind = KINDS[feature]
    dtype = np.dtype(_DTYPES[kind])
    info = np.iinfo(dtype)
    if int(release.payload.max()) > info.max or int(release.payload.min()) < -info.max:
        raise ValueError(f"the integer sum does not fit {dtype.name}: split the data over more devices")
    m = release.m
    pairs = np.empty(2 * m, dtype=dtype)
    pairs[0::2] = release.payload[:m]
    pairs[1::2] = release.payload[m:]
    return kind, pairs.tobytes()


def decode(kind: str, data: bytes, m: int) -> np.ndarray:
    """The (2, m) int64 array (re, im) of a payload."""
    dtype = _DTYPES.get(kind)
    if dtype is None:
        raise PayloadError(f"unknown payload kind {kind!r}")
    width = np.dtype(dtype).itemsize
    if len(data) != 2 * width * m:
        raise PayloadError(f"payload has {len(data)} bytes, the study needs 2m·{width} = {2 * width * m}")
    pairs = np.frombuffer(data, dtype=dtype)
    return np.stack([pairs[0::2], pairs[1::2]]).astype(np.int64)


def check_count(spec: StudySpec, n: float) -> None:
    """Refuse a record count the study cannot accept (PayloadError with the reason).

    A count is an integer. Under replace-one (n public) it lies in ``min_records`` ..
    ``device_cap`` (the study's ``max_device_records``); under add/remove (noisy) in
    −(radius + 1) .. ``device_cap`` + radius + 1, radius that of the count's DLap term: all
    the mechanism can release for a device holding at most ``device_cap`` records.
    """
    if not (np.isfinite(n) and n == int(n)):
        raise PayloadError(f"record count must be an integer, got {n}")
    cap = spec.device_cap
    if spec.sketch.privacy.neighbouring == "replace_one":
        low, high, what = spec.min_records, cap, "(replace-one, n public)"
    else:
        radius = count_radius(spec) + 1
        low, high, what = -radius, cap + radius, "(add/remove: the noisy count's possible range)"
    if not low <= n <= high:
        raise PayloadError(f"record count {n:g} is outside {low:,} .. {high:,} {what}; the study "
                           f"takes at most {cap:,} records per device")


def count_radius(spec: StudySpec) -> int:
    """Radius of the add/remove count's DLap term (records): the noise stays within it but for
    a probability below 2^−40 (:func:`~fedsketch.common.dp.calibration.noise_radius`)."""
    privacy, m = spec.sketch.privacy, spec.sketch.frequencies.m
    return noise_radius(noise_plan(spec.sketch.feature, m, spec.sketch.r, privacy)[1].scale, 1)


def max_abs_entry(spec: StudySpec, n: float) -> int:
    """The largest |Re| or |Im| of a payload entry (grid steps) that the study's mechanism can
    produce, given the contribution's record count ``n`` as sent (module docstring) and at most
    ``spec.device_cap`` true records."""
    privacy = spec.sketch.privacy
    feature, m = spec.sketch.feature, spec.sketch.frequencies.m
    terms = noise_plan(feature, m, spec.sketch.r, privacy)
    count_hi = min(max(int(n), 0), spec.device_cap)
    if privacy.neighbouring == "add_remove":  # the true count, within the noise's radius
        count_hi = min(count_hi + count_radius(spec) + 1, spec.device_cap)
    term = terms[0]
    if term.law == "discrete_laplace":
        radius = noise_radius(term.scale, 2 * m) + 1
    else:
        radius = int(np.ceil(GAUSS_TAIL * term.scale))
    return GRID[feature] * count_hi + radius


def check_payload(spec: StudySpec, kind: str, data: bytes, n: float) -> np.ndarray:
    """Decode and validate a contribution's payload; returns :func:`decode`'s (2, m) array."""
    expected = KINDS[spec.sketch.feature]
    if kind != expected:
        raise PayloadError(f"the study's {spec.sketch.feature} map travels as {expected}, "
                           f"got {kind}")
    check_count(spec, n)
    values = decode(kind, data, spec.sketch.frequencies.m)
    bound = max_abs_entry(spec, n)
    worst = max(int(values.max()), -int(values.min()))  # np.abs(−2^63) would wrap to −2^63
    if worst > bound:
        raise PayloadError(f"payload entry {worst} exceeds {bound}, the largest value "
                           "the study's mechanism can produce")
    return values
