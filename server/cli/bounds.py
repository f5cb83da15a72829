"""Public decoding bounds [lo, hi]^d: where the decoder may place centroids (data units).

Bounds come from the public spec or the operator, never from the data (docs/MECHANISMS.md §1.9).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def asks_auto(text: str) -> bool:
    """Whether ``--bounds TEXT`` asks for the private box read from the records (``auto``), not
    a bounds file that happens to be named ``auto``."""
    return text == "auto" and not Path(text).is_file()


def parse_bounds(text: str, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``LO:HI`` (the same on every axis) or a JSON file ``{"lo": [...], "hi": [...]}``.

    A JSON file may also give scalars for ``lo`` and ``hi``. Returns two float64 arrays of length
    d; raises ValueError unless lo < hi on every axis and all values are finite.
    """
    if asks_auto(text):
        raise ValueError("--bounds auto (a private box read from the records) is `fedsketch "
                         "sketch`'s, the Python API's and a federated study's box round "
                         "(create-study, simulate --data); here give the box, LO:HI or a "
                         "bounds.json")
    if ":" in text and not Path(text).is_file():
        try:
            lo_s, hi_s = text.split(":")
            lo_v, hi_v = float(lo_s), float(hi_s)
        except ValueError:
            raise ValueError(f"--bounds must be LO:HI or a JSON file, got {text!r}") from None
        lo, hi = np.full(d, lo_v), np.full(d, hi_v)
    else:
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"--bounds must be LO:HI or a JSON file; no file {text!r}")
        try:
            obj = json.loads(path.read_text())
            lo = np.broadcast_to(np.asarray(obj["lo"], dtype=np.float64), (d,)).copy()
            hi = np.broadcast_to(np.asarray(obj["hi"], dtype=np.float64), (d,)).copy()
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}: bounds JSON must be {{\"lo\": [{d} numbers], \"hi\": [{d} numbers]}} ({exc})"
            ) from None
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError("bounds must be finite")
    if np.any(lo >= hi):
        axis = int(np.argmax(lo >= hi))
        raise ValueError(f"bounds need lo < hi on every axis; axis {axis} has {lo[axis]} ≥ {hi[axis]}")
    return lo, hi
