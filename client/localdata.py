"""The device's records as the agent reads them, and what a refusal because of them means.

The agent never holds the records: it holds a :data:`DataFeed`, called once per study, which
returns a :class:`LocalData` for the data as they are then (the daemon's opens the data file
afresh, :func:`fedsketch.client.daemon.local_data`). Every pass over one LocalData reads the same
version of the data, or fails with a :class:`~fedsketch.common.data.dataio.DataError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from fedsketch.client.declines import Declined, out_of_range
from fedsketch.common.data.dataio import DataError
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.sketch.box import Tally
from fedsketch.common.study.study import StudySpec

log = logging.getLogger("fedsketch.device")

#: What reading the local data can raise: the file's content (DataError, ValueError) or the
#: file system (OSError: deleted, unreadable).
DATA_ERRORS = (DataError, ValueError, OSError)


@dataclass(frozen=True)
class LocalData:
    """One version of the device's records: a factory of chunk iterators over it (each chunk
    (rows, d), finite values, any real dtype; DataError if the data changed) and the dimension d.

    With ``n`` set, the records are summed where they lie (``device run --engine dask``:
    :class:`~fedsketch.common.sketch.dask_records.DaskRecords`, whose partitions' metadata give
    n): ``chunks()`` returns an object that computes its own feature sum, which only a plain
    study's one sketch release can use (:func:`summed_elsewhere_refusal`)."""

    chunks: Callable[[], Iterable[np.ndarray]]
    d: int
    n: int | None = None


#: How the agent reaches the device's records: called once per study.
DataFeed = Callable[[], LocalData]


class Stopped(Exception):
    """The daemon was asked to stop (SIGTERM, SIGINT) while it read its records. Raised between
    chunks, so always before the release is computed and its spend recorded: the pass ends with
    nothing spent, and whatever the device had joined it finds again on its next start."""


def stoppable(chunks: Iterable[np.ndarray], stop: threading.Event) -> Iterator[np.ndarray]:
    """``chunks``, raising :class:`Stopped` before each chunk and after the last one once ``stop``
    is set (so a stop during the last chunk still prevents the spend that follows the read)."""
    for chunk in chunks:
        if stop.is_set():
            raise Stopped
        yield chunk
    if stop.is_set():
        raise Stopped


class Retry(Declined):
    """A refusal that may pass (the local data unreadable, changed during the pass or holding a
    NaN; the budget): the study is tried again on the next pass, since the owner may fix the
    file or raise the budget meanwhile. ``code`` is the ``RefusalReason`` the device reports."""

    def __new__(cls, text: str, code: int = pb.DATA_UNREADABLE) -> Retry:
        return super().__new__(cls, text, code)


def data_refusal(exc: Exception) -> Retry:
    """The refusal for an error of :data:`DATA_ERRORS`."""
    return Retry(f"the data cannot be sketched for this study: {exc}", pb.DATA_UNREADABLE)


def summed_elsewhere_refusal(secure: bool, rounds: bool) -> Declined | None:
    """Why records summed on a cluster (``--engine dask``) cannot take part in a study, or None.
    Such records give exact feature sums and their count, which a plain study's sketch and its
    calibration round 0 (sketches at public σ's) are made of. Secure aggregation reads the
    records in this process (its exact input, masked), and refinement rounds read per-cell
    counts and sums; neither runs on the cluster yet, so the study is declined before anything
    is read or spent."""
    asks = [what for what, needed in (("secure aggregation", secure),
                                      ("refinement rounds", rounds)) if needed]
    if not asks:
        return None
    return Declined(f"--engine dask sums the records for a plain study's sketch (and its round 0) "
                    f"only; this study asks for {' and '.join(asks)}: run the daemon with --engine "
                    "local (the records read here) to take part", pb.DATA_UNREADABLE)


def log_clipped(study_id: str, tally: Tally) -> None:
    """Tell the device's own log how many records were clipped into the box (never sent)."""
    if tally.clipped:
        log.info("study %s: %d of %d records lay outside the study's box and were clipped into it "
                 "(this count stays on the device)", study_id, tally.clipped, tally.records)


def count_records(data: LocalData, spec: StudySpec) -> int | str:
    """One pass counting the records: n, or why the device cannot take part (more records than
    the study's cap, too few for ``min_records``, unreadable data). The count stops with the
    chunk that passes the cap: how long a refusing device takes does not grow with its n
    (:mod:`.declines`). Records summed on a cluster give n from their partitions' metadata
    (checked again by each worker as it reads its partition)."""
    n, cap = 0, spec.device_cap
    try:
        if data.n is not None:
            n = data.n
        else:
            for chunk in data.chunks():
                n += chunk.shape[0]
                if n > cap:
                    break
    except DATA_ERRORS as exc:
        return data_refusal(exc)
    return n if (reason := out_of_range(spec, n)) is None else reason
