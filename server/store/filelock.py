"""One coordinator per SQLite file: an exclusive lock held for the store's lifetime.

Two coordinators on one SQLite file would each believe their in-memory state (secure-aggregation
rounds, deadline watchers) is the only one: the second one's start-up fails the first one's
running secure study. So ``coordinator serve`` takes an exclusive ``flock`` on ``<file>.lock``
(created owner-only) before it opens the store, without waiting, and holds it while it serves.
The kernel drops the lock when the process dies, so a SIGKILLed coordinator never leaves a
stale lock behind. The lock is a separate file so that it never interacts with SQLite's own
POSIX locks on the database, which other readers (an operator's inspection, the tests) share.
"""

from __future__ import annotations

import fcntl
import os

from fedsketch.server.errors import Code
from fedsketch.server.store.base import StoreError


def hold_exclusive(db_path: str) -> int:
    """Lock ``db_path + ".lock"`` for this process and return the open descriptor (closing it
    releases the lock); StoreError 'failed_precondition' if another coordinator holds it."""
    lock_path = db_path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(Code.FAILED_PRECONDITION, f"{db_path} is in use by another coordinator "
                         f"(it holds {lock_path}): one coordinator serves one SQLite file") from None
    return fd
