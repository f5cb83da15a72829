"""Sketch payloads on the wire: the integer release as little-endian pairs, and back.

A payload is the noisy encoded sum S~ ∈ Z^{2m} in grid steps (:mod:`fedsketch.common.sketch.privacy`),
interleaved (Re S~_1, Im S~_1, Re S~_2, …) in little-endian integers (``Contribution.payload`` in
``proto/fedsketch.proto``): ``int64_pairs`` for the ``complex`` map (γ = 1024 steps per unit, so
|S| reaches 1024·n) and ``int32_pairs`` for ``quantized`` (γ = 1). The grid γ is public, fixed
by the feature map (:data:`fedsketch.common.features.GRID`); the record count travels as an
integer-valued double. The coordinator sums the integers and divides by γ·α·N·√m
(MECHANISMS §1.8, §1.10).

The coordinator's check of a payload against its study is :mod:`fedsketch.common.study.payload`.
"""

from __future__ import annotations

import numpy as np

from ..sketch.privacy import PrivateSketch

KINDS: dict[str, str] = {"complex": "int64_pairs", "quantized": "int32_pairs"}
_DTYPES: dict[str, str] = {"int64_pairs": "<i8", "int32_pairs": "<i4"}
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
