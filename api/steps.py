"""The ``sketch``, ``decode`` and ``evaluate`` commands as functions on arrays, files and chunks.

Each runs the same code as its command (:class:`fedsketch.common.sketch.dataset_sketch.SketchPlan`,
:func:`fedsketch.server.decode.pipeline.decode_judged`,
:func:`fedsketch.server.bench.metrics.evaluate_centroids`) with the same defaults, so a sketch made
here decodes with ``fedsketch decode`` and the other way round.

Records (``data``) come in one of three forms, all in data units:

* an array-like of shape (n, d) (a numpy array, a pandas DataFrame, nested lists; any real
  dtype; NaN or ±inf is refused, naming the row);
* a path to a ``.npy`` (2-D, any order), CSV or Parquet file, read in chunks as the command
  reads it; ``columns`` (names) and ``header`` (CSV: True, False, or None to detect it) are the
  commands' ``--columns`` and ``--header/--no-header``;
* an iterable of chunks, each (rows, d). A list (or any re-iterable) may be read twice; a one-shot
  iterator (a generator) is read once, so it needs a numeric ``scale``: ``scale="auto"`` spends a
  first pass on the private choice of σ.

Privacy: every sketch draws fresh noise from OS bits (the integer mechanisms of
:mod:`fedsketch.common.sketch.privacy`); ``seed`` fixes the public frequencies only, never the noise.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from itertools import chain

import numpy as np

from fedsketch.common.choices import UNPLANNED_M
from fedsketch.common.data.dataio import DataSource, ReadOptions
from fedsketch.common.sketch.box import Box, Tally
from fedsketch.common.sketch.dataset_sketch import SketchPlan
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.private_box import BOX_FRACTION
from fedsketch.common.sketch.sketchfile import SketchFile, load_sketch
from fedsketch.common.study.sizing import size_for_sketch
from fedsketch.common.study.verdict import CAVEATS, Verdict
from fedsketch.server.bench.metrics import Evaluation, evaluate_centroids
from fedsketch.server.cli.bounds import parse_bounds
from fedsketch.server.decode.identify import Identifiability
from fedsketch.server.decode.pipeline import Decoding, decode_judged

#: A released sketch, in memory or read from its ``.npz`` (:meth:`Sketch.save`, :func:`load_sketch`).
Sketch = SketchFile

__all__ = ["Decoding", "Evaluation", "Identifiability", "NotIdentifiableWarning", "Sketch", "decode",
           "evaluate", "load_sketch", "sketch"]

#: Records: an array-like (n, d), a data file's path, or an iterable of (rows, d) chunks.
Records = np.ndarray | str | os.PathLike | Iterable[np.ndarray]
#: The public box: ``(lo, hi)`` (each a number, or d numbers), ``"LO:HI"``, or a bounds.json path.
Bounds = tuple | str | os.PathLike | Box


class NotIdentifiableWarning(UserWarning):
    """Centroids whose verdict is not "good" (:attr:`Decoding.verdict`,
    :mod:`fedsketch.common.study.verdict`): "usable, with caveats" or "unreliable", with why."""


def sketch(data: Records, *, epsilon: float = 1.0, delta: float = 0.0,
           neighbouring: str = "replace_one", m: int | None = None, k: int | None = None,
           r: int | None = None,
           feature: str = "complex", law: str = "adapted_radius", scale: float | str = "auto",
           seed: int = 0, dither: bool = True, bounds: Bounds | None = None, auto_fraction: float = 0.1,
           scale_range: tuple[float, float] | None = None, columns: Sequence[str] | None = None,
           header: bool | None = None, box_fraction: float = BOX_FRACTION) -> Sketch:
    """The private sketch of ``data`` (module docstring), as ``fedsketch sketch`` makes it.

    ``epsilon`` is the whole budget (math.inf: no noise, no privacy), calibration included;
    ``delta`` > 0 selects the discrete Gaussian; ``neighbouring`` is "replace_one" or
    "add_remove". ``m`` frequencies (None: planned for ``k`` clusters from the record count, d
    and ε as ``fedsketch sketch --k`` plans it, the sketch's ``spec.frequencies.m``; under
    add/remove a noisy count at 2 % of ε, in ``epsilon_spent``; 1000 without ``k``)
    drawn by ``law`` at scale σ = ``scale`` (data units), or
    "auto": σ is chosen privately in ``scale_range`` (data units; None: h̄/60..5h̄/3 for
    the box's mean half-width h̄) with ``auto_fraction`` of ε. ``seed`` is the
    public seed of Ω and ξ; each record contributes to ``r`` of the m entries (default m).
    Records are clipped into ``bounds`` (default ±2^40 on every axis, which only keeps phases
    finite; "auto": a private box read from the records with ``box_fraction`` of ε, stored in
    the sketch for :func:`decode`); a UserWarning says how many were (a count that is not
    private and not stored).
    """
    plan = SketchPlan(PrivacySpec(float(epsilon), delta, neighbouring), m=UNPLANNED_M if m is None else m,
                      feature=feature, law=law, scale=_scale(scale), seed=seed, r=r, dither=dither,
                      auto_fraction=auto_fraction,
                      scale_range=None if scale_range is None else tuple(scale_range),
                      box_fraction=box_fraction)
    auto = isinstance(bounds, str) and bounds == "auto"
    planned = m is None and k is not None
    options = _options(data, columns, header)
    chunks, d = _records(data, twice=plan.scale is None or auto or planned, options=options)
    box = Box.widest(d) if bounds is None else None if auto else as_box(bounds, d)
    size = None
    if planned:  # after every check: under add/remove the plan spends on a noisy count
        reads = (auto_fraction if plan.scale is None else 0.0) + (box_fraction if auto else 0.0)
        n = (DataSource(data, options=options).n if isinstance(data, (str, os.PathLike))
             else sum(c.shape[0] for c in chunks()))  # a file's layout says n: no pass over it
        rest, size = size_for_sketch(n, d, int(k), float(epsilon), neighbouring=neighbouring,
                                     feature=feature, reads=reads)
        plan = replace(plan, m=size.m, privacy=PrivacySpec(rest, delta, neighbouring))
    tally = Tally()
    made = plan.run(chunks, box, d=d, tally=tally)
    released = made.to_file()
    if planned and plan.privacy.epsilon < float(epsilon):  # the plan's noisy count, spent too
        count_epsilon = float(epsilon) - plan.privacy.epsilon
        released = replace(released, epsilon_spent=released.epsilon_spent + count_epsilon)
    if made.calibration is not None and made.calibration.choice not in ("fit", "typical scale"):
        cal = made.calibration
        warnings.warn(f"scale='auto': {cal.explanation}"
                      f"{cal.advice('scale=σ', 'bounds=', 'scale_range=')}", stacklevel=2)
    if tally.clipped:
        warnings.warn(f"{tally.clipped:,} of {tally.records:,} records lay outside the box and were clipped "
                      "into it (this count is not private; it is not stored)", stacklevel=2)
    return released


def decode(sketch: Sketch | str | os.PathLike, k: int, bounds: Bounds | None = None, *,
           replicates: int = 3, seed: int | None = None) -> Decoding:
    """k centroids and weights decoded from ``sketch`` (a :class:`Sketch` or its file) inside the public
    box ``bounds`` (None: the box the sketch holds, read by ``bounds="auto"``) by CL-OMPR, the best
    of ``replicates`` runs (``seed``: the decoder's random starts), with the verdict on them
    (``Decoding.verdict``: "good", "usable, with caveats" or "unreliable"), as ``fedsketch decode``
    does. Reads no data. A :class:`NotIdentifiableWarning` repeats a verdict other than "good"."""
    name = "the sketch"
    if not isinstance(sketch, SketchFile):
        name, sketch = str(sketch), load_sketch(sketch)
    box = sketch.stored_box() if bounds is None else as_box(bounds, sketch.spec.frequencies.d)
    if box is None:
        raise ValueError(f"{name} holds no box (only bounds=\"auto\" stores one): give bounds=")
    sketch.check_frequencies(name)
    out = decode_judged(sketch.sketch, sketch.spec, k, box.lo, box.hi, records=sketch.n,
                        replicates=replicates, rng=np.random.default_rng(seed))
    if out.verdict.warns:
        warnings.warn(f"{out.verdict.status}: {out.verdict.reason}", NotIdentifiableWarning, stacklevel=2)
    return out


def evaluate(data: Records, centroids: np.ndarray | Decoding, *, seed: int = 0,
             columns: Sequence[str] | None = None, header: bool | None = None) -> Evaluation:
    """SSE/n of ``centroids`` ((k, d) array-like, or a :class:`Decoding`) on ``data``, and relative
    SSE against scikit-learn's k-means (k-means++, n_init = 3, seeded by ``seed``) on the same
    records held in memory; the reference is None without scikit-learn. Not private: it reads the
    records, as ``fedsketch evaluate`` does."""
    c = np.asarray(centroids.centroids if isinstance(centroids, Decoding) else centroids, dtype=np.float64)
    chunks, d = _records(data, twice=True, options=_options(data, columns, header))
    if c.ndim != 2 or c.shape[0] == 0 or not np.all(np.isfinite(c)):
        raise ValueError(f"centroids must be a non-empty finite (k, d) array, got shape {c.shape}")
    if c.shape[1] != d:
        raise ValueError(f"centroids have dimension {c.shape[1]}, the records {d}")
    return evaluate_centroids(chunks, c, seed)


def as_box(bounds: Bounds, d: int) -> Box:
    """The public box [lo, hi]^d from any form of ``bounds`` (:data:`Bounds`). ValueError unless
    lo < hi on every axis, all finite."""
    if isinstance(bounds, Box):
        if bounds.d != d:
            raise ValueError(f"the box has d = {bounds.d}, the records d = {d}")
        return bounds
    if isinstance(bounds, (str, os.PathLike)):
        return Box(*parse_bounds(os.fspath(bounds), d))
    try:
        lo, hi = bounds
        lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), (d,))
        hi = np.broadcast_to(np.asarray(hi, dtype=np.float64), (d,))
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be (lo, hi) with numbers or {d} numbers each, 'LO:HI' or a "
                         f"bounds.json path, got {bounds!r}") from None
    return Box(lo, hi)


def _scale(scale: float | str) -> float | None:
    """σ as a float, or None for "auto"."""
    if isinstance(scale, str):
        if scale == "auto":
            return None
        raise ValueError(f"scale must be a positive number or 'auto', got {scale!r}")
    return float(scale)


def _options(data: Records, columns: Sequence[str] | None, header: bool | None) -> ReadOptions:
    """How to read ``data`` if it is a file; ValueError for ``columns``/``header`` beside records
    given in memory (they would be silently ignored)."""
    if not isinstance(data, (str, os.PathLike)):
        if columns is not None or header is not None:
            raise ValueError("columns and header apply to a data file, not to records in memory "
                             "(select the columns of the array or DataFrame instead)")
        return ReadOptions()
    if isinstance(columns, str):
        raise ValueError(f"columns must be a sequence of names, got the string {columns!r}")
    return ReadOptions.parse(header, None if columns is None else ",".join(columns))


def _records(data: Records, *, twice: bool,
             options: ReadOptions) -> tuple[Callable[[], Iterator[np.ndarray]], int]:
    """(chunks, d): a callable yielding the records of ``data`` (module docstring) in checked
    chunks, and their dimension. ValueError if ``twice`` (two passes needed) and ``data`` is a
    one-shot iterator."""
    if isinstance(data, (str, os.PathLike)):
        source = DataSource(data, options=options)
        return source.chunks, source.d
    if hasattr(data, "__array__") or not isinstance(data, Iterable) or _is_table(data):
        x = _checked(_as_array(data), 0)
        return (lambda: iter((x,))), x.shape[1]
    if iter(data) is data:
        if twice:
            raise ValueError("a one-shot iterator of chunks is read once, but scale='auto', "
                             "bounds='auto' (or the k-means reference) need more passes: give a "
                             "numeric scale and a box, or a list")
        first = next(data, None)
        if first is None:
            raise ValueError("no records: the iterator yielded no chunk")
        first = _checked(_as_array(first), 0)
        return (lambda: _checked_chunks(chain((first,), data))), first.shape[1]
    first = next(iter(data), None)
    if first is None:
        raise ValueError("no records: no chunks given")
    return (lambda: _checked_chunks(data)), _checked(_as_array(first), 0).shape[1]


def _is_table(data: object) -> bool:
    """Whether ``data`` is one table given as nested sequences ([[1, 2], [3, 4]]), not chunks."""
    if not isinstance(data, (list, tuple)) or not data:
        return False
    return np.ndim(data[0]) == 1


def _checked_chunks(chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    """Each chunk as a checked array (:func:`_checked`), rows numbered across chunks."""
    row = 0
    for chunk in chunks:
        x = _checked(_as_array(chunk), row)
        row += x.shape[0]
        yield x


def _as_array(data: object) -> np.ndarray:
    """``data`` as an array; a pandas DataFrame column by column, so that a column that does not
    hold numbers is named and nullable ones (Float64, Int64) read as float64 with NA as NaN."""
    dtypes = getattr(data, "dtypes", None)
    if not hasattr(dtypes, "items") or not hasattr(data, "to_numpy"):
        return np.asarray(data)
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    for name, dtype in dtypes.items():
        if is_bool_dtype(dtype) or not is_numeric_dtype(dtype):
            raise ValueError(f"column {name!r} ({dtype}) does not hold numbers; select the numeric columns")
    return data.to_numpy(dtype=np.float64, na_value=np.nan)


def _checked(x: np.ndarray, first_row: int) -> np.ndarray:
    """``x`` if it is a 2-D array of finite real numbers (records × dimensions); else ValueError
    naming the problem (and the first bad row, counted from ``first_row``)."""
    if x.dtype.kind not in "fiu":
        raise ValueError(f"records must be real numbers, got dtype {x.dtype}")
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"records must be a 2-D array (records × dimensions), got shape {x.shape}")
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise ValueError(f"row index {first_row + int(np.argmin(finite))} (counted from 0) holds a NaN or an "
                         "infinity, which no clipping can map into a box; fix or drop that record")
    return x


def verdict_from_dict(data: dict) -> Identifiability:
    """An :class:`Identifiability` from its JSON form (``decode --json``'s, or a study result's,
    which has no ``noise_sd``: NaN then)."""
    return Identifiability(str(data["status"]), str(data.get("reason", "")),
                           tuple(float(z) for z in data.get("z", ())), float(data.get("threshold", math.nan)),
                           float(data.get("noise_sd", math.nan)))


def quality_from_dict(data: dict) -> Verdict:
    """The :class:`~fedsketch.common.study.verdict.Verdict` of a result's JSON form (its
    ``verdict``), or for a result written before the verdict existed, "usable, with caveats"
    saying it was not judged."""
    if isinstance(data.get("verdict"), dict):
        return Verdict.from_dict(data["verdict"])
    return Verdict(CAVEATS, "this result predates the quality verdict; it was not judged")
