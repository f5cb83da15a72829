"""The sketch file (``.npz``): a released sketch, its record count and its full spec as JSON.

Keys:
    ``sketch``   complex128 (m,): the normalized sketch (1/n)·Σ f(Ωᵀx+ξ)/√m (+ noise);
    ``n``        float64 scalar: the released record count (exact under replace-one, noisy under
                 add/remove);
    ``spec``     JSON text: ``format``, ``spec`` (:class:`SketchSpec`), ``spec_sha256``,
                 ``omega_sha256`` (SHA-256 of Ω‖ξ), ``mechanism`` (noise terms), and
                 ``calibration`` (the private-scale round, or null);
    ``payload``  int64 (2m,), only for integer releases: the noisy integer sums (re, then im).

Files are written to a temporary sibling and renamed into place, so an error never leaves a
partial file behind.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomicfile import atomic_write
from .privacy import PrivateSketch
from .spec import SketchSpec

FORMAT = "fedsketch.sketch/1"


@dataclass(frozen=True)
class SketchFile:
    """A sketch file's contents."""

    sketch: np.ndarray
    n: float
    spec: SketchSpec
    omega_sha256: str
    mechanism: dict
    calibration: dict | None
    payload: np.ndarray | None


def save_sketch(
    path: str | os.PathLike[str],
    spec: SketchSpec,
    release: PrivateSketch,
    omega_sha256: str,
    calibration: dict | None = None,
) -> None:
    """Write ``release`` and its spec to ``path`` atomically."""
    path = Path(path)
    meta = {
        "format": FORMAT,
        "spec": spec.to_dict(),
        "spec_sha256": spec.digest(),
        "omega_sha256": omega_sha256,
        "mechanism": release.mechanism(),
        "calibration": calibration,
    }
    arrays = {
        "sketch": release.sketch,
        "n": np.float64(release.n),
        "spec": np.array(json.dumps(meta)),
    }
    if release.payload is not None:
        arrays["payload"] = release.payload.astype(np.int64)
    with atomic_write(path) as fh:
        np.savez(fh, **arrays)


def load_sketch(path: str | os.PathLike[str]) -> SketchFile:
    """Read and validate a sketch file; raises ValueError with the reason if it is unusable."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a sketch file ({exc})") from None
    missing = {"sketch", "n", "spec"} - arrays.keys()
    if missing:
        raise ValueError(f"{path}: not a sketch file (missing {', '.join(sorted(missing))})")
    meta = json.loads(str(arrays["spec"]))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: unsupported format {meta.get('format')!r}, expected {FORMAT}")
    spec = SketchSpec.from_dict(meta["spec"])
    sketch = np.asarray(arrays["sketch"], dtype=np.complex128)
    if sketch.shape != (spec.frequencies.m,):
        raise ValueError(f"{path}: sketch has shape {sketch.shape}, spec says m = {spec.frequencies.m}")
    if not np.all(np.isfinite(sketch)):
        raise ValueError(f"{path}: sketch has non-finite entries")
    return SketchFile(
        sketch=sketch,
        n=float(arrays["n"]),
        spec=spec,
        omega_sha256=str(meta["omega_sha256"]),
        mechanism=meta["mechanism"],
        calibration=meta.get("calibration"),
        payload=arrays.get("payload"),
    )
