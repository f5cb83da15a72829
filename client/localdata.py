"""The device's records as the agent reads them, and what a refusal because of them means.

The agent never holds the records: it holds a :data:`DataFeed`, called once per study, which
returns a :class:`LocalData` for the data as they are then (the daemon's opens the data file
afresh, :func:`fedsketch.client.daemon.local_data`). Every pass over one LocalData reads the same
version of the data, or fails with a :class:`~fedsketch.common.dataio.DataError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from fedsketch.common.box import Tally
from fedsketch.common.dataio import DataError

log = logging.getLogger("fedsketch.device")

#: What reading the local data can raise: the file's content (DataError, ValueError) or the
#: file system (OSError: deleted, unreadable).
DATA_ERRORS = (DataError, ValueError, OSError)


@dataclass(frozen=True)
class LocalData:
    """One version of the device's records: a factory of chunk iterators over it (each chunk
    (rows, d), finite values, any real dtype; DataError if the data changed) and the dimension d."""

    chunks: Callable[[], Iterable[np.ndarray]]
    d: int


#: How the agent reaches the device's records: called once per study.
DataFeed = Callable[[], LocalData]


class Retry(str):
    """A refusal because of the local data (unreadable, changed during the pass, a NaN): the study
    is tried again on the next pass, since the owner may fix the file meanwhile."""


def data_refusal(exc: Exception) -> Retry:
    """The refusal for an error of :data:`DATA_ERRORS`."""
    return Retry(f"the data cannot be sketched for this study: {exc}")


def log_clipped(study_id: str, tally: Tally) -> None:
    """Tell the device's own log how many records were clipped into the box (never sent)."""
    if tally.clipped:
        log.info("study %s: %d of %d records lay outside the study's box and were clipped into it "
                 "(this count stays on the device)", study_id, tally.clipped, tally.records)
