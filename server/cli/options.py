"""Option values the commands parse alike: ``--scale`` (σ or ``auto``) and a ``LO:HI`` range."""

from __future__ import annotations

import math


def parse_scale(scale: str) -> float | None:
    """σ as a positive float, or None for ``auto``."""
    if scale == "auto":
        return None
    try:
        value = float(scale)
    except ValueError:
        raise ValueError(f"--scale must be a positive number or 'auto', got {scale!r}") from None
    if not 0 < value < math.inf:
        raise ValueError(f"--scale must be a positive number or 'auto', got {scale!r}")
    return value


def parse_range(text: str, name: str) -> tuple[float, float]:
    """'LO:HI' as two floats with 0 < LO < HI."""
    try:
        lo, hi = (float(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"{name} must be LO:HI, got {text!r}") from None
    if not 0 < lo < hi < math.inf:
        raise ValueError(f"{name} needs 0 < LO < HI, got {text!r}")
    return lo, hi
