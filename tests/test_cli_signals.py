"""A command stops on SIGTERM whatever its main thread was doing (fedsketch.common.cli.stop_on_signals).

The hang it guards against: a handler that calls ``Event.set()`` runs in the main thread between
two bytecodes; if those were inside the same Event's ``wait``, with its condition's lock held,
the handler waits for a lock its own thread holds. A device daemon polling with ``stop.wait``
hung so once, deaf to every later SIGTERM. Here the main thread holds that lock on purpose when
the signal arrives; the child must still see the Event set. It runs in a process of its own with
a time bound, since the failure is a hang."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import os, signal
from fedsketch.common.cli import stop_on_signals
stop = stop_on_signals()
with stop._cond:  # the main thread inside Event.wait's critical section, its lock held
    os.kill(os.getpid(), signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)  # handlers run here, in this thread, lock still held
print("stopped" if stop.wait(20) else "not stopped", flush=True)
"""


def test_a_signal_during_the_stop_events_own_wait_still_stops():
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "stopped", (res.stdout, res.stderr)
