"""The public specification of one sketch release, and its canonical digest.

A :class:`SketchSpec` is everything a device needs to compute a release and everything a decoder
needs to read it: the frequency spec (Ω, ξ), the feature map, r, and the privacy budget. Its
canonical JSON (sorted keys, no whitespace) is hashed with SHA-256 so that two parties can check
they agree on every public parameter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..features import check_feature
from ..spec_fields import integer, json_type, text
from .box import Box, Tally
from .frequencies import FrequencySpec, draw_frequencies
from .privacy import PrivacySpec, PrivateSketch, privatize
from .sketching import check_r, feature_sum


@dataclass(frozen=True)
class SketchSpec:
    """Frequencies, feature map f, r of m entries per record, and the privacy budget."""

    frequencies: FrequencySpec
    feature: str
    r: int
    privacy: PrivacySpec

    def __post_init__(self) -> None:
        check_feature(self.feature)
        check_r(self.r, self.frequencies.m)

    def to_dict(self) -> dict:
        """JSON-ready nested dict."""
        return {
            "frequencies": self.frequencies.to_dict(),
            "feature": self.feature,
            "r": self.r,
            "privacy": self.privacy.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> SketchSpec:
        """Inverse of :meth:`to_dict`; raises ValueError on a missing or invalid field (one of
        another JSON type than its own included: :mod:`~.spec_fields`)."""
        if not isinstance(data, dict):
            raise ValueError(f"sketch must be an object, got {json_type(data)}")
        try:
            return cls(
                FrequencySpec.from_dict(data["frequencies"]),
                text(data["feature"], "sketch.feature"),
                integer(data["r"], "sketch.r"),
                PrivacySpec.from_dict(data["privacy"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"incomplete sketch spec: {exc!r}") from None

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical JSON of :meth:`to_dict`."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()


def release_sketch(spec: SketchSpec, chunks: Iterable[np.ndarray], box: Box, *,
                   tally: Tally | None = None,
                   progress: Callable[[int], None] | None = None) -> PrivateSketch:
    """The data half of compressive k-means, as the ``sketch`` command, a device's contribution
    and ``compare``'s ckm all run it: S = Σ_i f(Ωᵀx_i + ξ) ⊙ b_i over the finite record
    ``chunks`` (each (rows, d), data units, any real dtype) mapped into the public ``box``
    (clipped and centred, :mod:`~.box`; the clipped count goes to ``tally``), with Ω, ξ drawn
    from ``spec.frequencies`` and r of m entries per record (:func:`~.sketching.feature_sum`),
    released under ``spec.privacy`` (:func:`~.privacy.privatize`, fresh noise from OS bits).
    ``progress(rows)`` after each chunk. ValueError, before any noise is drawn, if the box is
    too wide for Ω."""
    freqs = box.reduce(draw_frequencies(spec.frequencies))
    fs = feature_sum(box.centred(chunks, tally), freqs, spec.feature, spec.r, progress=progress)
    return privatize(fs, spec.privacy)


def canonical_json(obj: object) -> str:
    """Deterministic JSON: sorted keys, compact separators, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
