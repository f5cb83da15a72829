"""The sketch file (``.npz``): a released sketch as integers, its record count and its full spec.

Keys:
    ``payload``  int64 (2m,): the noisy encoded sum S~ (re, then im) in grid steps;
    ``n``        int64 scalar: the released record count (exact under replace-one, noisy under
                 add/remove);
    ``spec``     JSON text: ``format``, ``spec`` (:class:`SketchSpec`), ``spec_sha256``,
                 ``omega_sha256`` (SHA-256 of Ω‖ξ), ``grid`` (γ, steps per unit of the feature
                 map), ``mechanism`` (noise terms), ``epsilon_spent`` (the ε of everything this
                 file's data was charged for, calibration and box included), ``calibration`` (the
                 private-scale round, or null) and ``box`` (the private box read from the
                 records, :class:`~.private_box.PrivateBox`'s dict, or null when the user gave one).

Every released value is an integer (MECHANISMS §1.10); the normalized sketch
s = S~/(γ·α·max(n, 1)·√m) is computed when the file is read. Files are written to a temporary
sibling and renamed into place, so an error never leaves a partial file behind.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomicfile import atomic_write
from ..features import GRID
from .box import Box
from .frequencies import draw_frequencies
from .privacy import PrivateSketch
from .sketching import normalized_sketch
from .spec import SketchSpec

FORMAT = "fedsketch.sketch/2"


@dataclass(frozen=True)
class SketchFile:
    """A released sketch as its file holds it (read by :func:`load_sketch`, or made in memory by
    :meth:`from_release`); ``sketch`` is the normalized complex sketch (m,)."""

    payload: np.ndarray = field(repr=False)  # 2m integers: a repr shows the spec and n
    n: int
    spec: SketchSpec
    omega_sha256: str
    mechanism: dict
    calibration: dict | None
    epsilon_spent: float
    box: dict | None = None

    @property
    def sketch(self) -> np.ndarray:
        """s = S~/(γ·α·max(n, 1)·√m), complex128 (m,)."""
        m = self.spec.frequencies.m
        return normalized_sketch(self.payload[:m], self.payload[m:], GRID[self.spec.feature],
                                 self.spec.r / m, self.n)

    @classmethod
    def from_release(cls, spec: SketchSpec, release: PrivateSketch, omega_sha256: str,
                     calibration: dict | None = None, box: dict | None = None) -> SketchFile:
        """``release`` of ``spec`` as a file holds it. ``epsilon_spent`` is the release's ε plus
        the calibration round's (``calibration["epsilon"]``) and the private box's (``box``)."""
        spent = release.privacy.epsilon + sum(float(part["epsilon"]) for part in (calibration, box)
                                              if part is not None)
        return cls(release.payload.astype(np.int64), int(release.n), spec, omega_sha256,
                   release.mechanism(), calibration, spent, box)

    def stored_box(self) -> Box | None:
        """The box the sketch was clipped into when it read one from its records (``box``), as a
        :class:`~.box.Box`; None when the box was the caller's."""
        return None if self.box is None else Box(np.asarray(self.box["lo"]), np.asarray(self.box["hi"]))

    def check_frequencies(self, name: str = "the sketch") -> None:
        """ValueError unless the Ω, ξ drawn from the spec hash to ``omega_sha256`` (the frequencies
        the sketch was made with); ``name`` (the file) heads the message."""
        found = draw_frequencies(self.spec.frequencies).sha256
        if found != self.omega_sha256:
            raise ValueError(f"{name}: frequencies hash mismatch (file {self.omega_sha256[:12]}…, "
                             f"recomputed {found[:12]}…); refusing to decode")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the sketch to ``path`` (``.npz``, module docstring) atomically."""
        meta = {
            "format": FORMAT,
            "spec": self.spec.to_dict(),
            "spec_sha256": self.spec.digest(),
            "omega_sha256": self.omega_sha256,
            "grid": GRID[self.spec.feature],
            "mechanism": self.mechanism,
            "epsilon_spent": "inf" if math.isinf(self.epsilon_spent) else self.epsilon_spent,
            "calibration": self.calibration,
            "box": self.box,
        }
        arrays = {"payload": self.payload, "n": np.int64(self.n), "spec": np.array(json.dumps(meta))}
        with atomic_write(Path(path)) as fh:
            np.savez(fh, **arrays)


def save_sketch(
    path: str | os.PathLike[str],
    spec: SketchSpec,
    release: PrivateSketch,
    omega_sha256: str,
    calibration: dict | None = None,
) -> None:
    """Write ``release`` and its spec to ``path`` atomically (:meth:`SketchFile.save`)."""
    SketchFile.from_release(spec, release, omega_sha256, calibration).save(path)


def load_sketch(path: str | os.PathLike[str]) -> SketchFile:
    """Read and validate a sketch file; raises ValueError with the reason if it is unusable."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    what = "a sketch is the .npz file `fedsketch sketch` writes"
    try:
        loaded = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, zipfile.BadZipFile):  # numpy's words here are about pickles
        raise ValueError(f"{path}: not a sketch file ({what})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a sketch file but one array ({what})")
    try:
        with loaded as npz:
            arrays = {key: npz[key] for key in npz.files}
        meta = json.loads(str(arrays["spec"]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a sketch file ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{path}: unsupported format {found!r}, expected {FORMAT}"
                         + (" (fedsketch.sketch/1 files hold a float release, which this version "
                            "no longer reads: sketch the data again)"
                            if found == "fedsketch.sketch/1" else ""))
    missing = {"payload", "n"} - arrays.keys()
    if missing:
        raise ValueError(f"{path}: not a sketch file (missing {', '.join(sorted(missing))})")
    spec = SketchSpec.from_dict(meta["spec"])
    payload, n = arrays["payload"], arrays["n"]
    if payload.dtype != np.int64 or payload.shape != (2 * spec.frequencies.m,):
        raise ValueError(f"{path}: payload must be int64 of shape (2m,) = "
                         f"({2 * spec.frequencies.m},), got {payload.dtype} {payload.shape}")
    if n.dtype != np.int64 or n.shape != ():
        raise ValueError(f"{path}: the record count must be an int64 scalar")
    if meta.get("grid") != GRID[spec.feature]:
        raise ValueError(f"{path}: grid {meta.get('grid')!r} is not the {spec.feature} map's "
                         f"{GRID[spec.feature]}")
    return SketchFile(
        payload=payload,
        n=int(n),
        spec=spec,
        omega_sha256=str(meta["omega_sha256"]),
        mechanism=meta["mechanism"],
        calibration=meta.get("calibration"),
        epsilon_spent=float(meta["epsilon_spent"]),
        box=_box_of(meta.get("box"), spec.frequencies.d, path),
    )


def _box_of(box: object, d: int, path: Path) -> dict | None:
    """A file's ``box`` entry, checked: None, or lo and hi of d finite numbers with lo < hi."""
    if box is None:
        return None
    try:
        lo, hi = (np.asarray(box[key], dtype=np.float64) for key in ("lo", "hi"))
        ok = lo.shape == hi.shape == (d,) and bool(np.all(np.isfinite(lo) & np.isfinite(hi) & (lo < hi)))
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{path}: its box is not {d} finite intervals lo < hi")
    return box
