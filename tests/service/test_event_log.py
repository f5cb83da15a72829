"""The deferred ``contribute`` line (``server/service/events.py``): a Submit's thread only
queues it; the log's own thread writes it with the time of the write it reports, an event
logged at once writes the queued ones before itself (the log keeps the order of events), and
the queue is written out at exit."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
from datetime import datetime

import pytest

from fedsketch.server.cli.logformat import JsonFormatter
from fedsketch.server.service import events


@pytest.fixture
def lines():
    """The JSON lines the events logger has written so far (a function to call)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("fedsketch.events")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    events.flush()  # nothing of an earlier test's in this one
    yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_the_log_thread_writes_a_deferred_event_with_the_time_it_happened(lines):
    events._start_writer()
    with events._order:  # the log's thread cannot write before the test lets it
        before = time.time()
        events.defer("contribute", study="st-1", device="dev-1")
        after = time.time()
        time.sleep(1.5)
        assert lines() == []
    deadline = time.monotonic() + 60  # generous: the thread writes within DEFER_SECONDS when idle
    while not lines() and time.monotonic() < deadline:
        time.sleep(0.01)
    (line,) = lines()
    assert (line["event"], line["study"], line["device"]) == ("contribute", "st-1", "dev-1")
    stamped = datetime.fromisoformat(line["ts"].replace("Z", "+00:00")).timestamp()
    assert before - 0.001 <= stamped <= after  # when it was deferred (ms), not when written


def test_an_event_logged_at_once_comes_after_the_deferred_ones(lines):
    for device in ("dev-1", "dev-2"):
        events.defer("contribute", study="st-1", device=device)
    events.emit("state", study="st-1", state="collecting", detail="")
    assert [(e["event"], e.get("device")) for e in lines()] == [
        ("contribute", "dev-1"), ("contribute", "dev-2"), ("state", None)]


def test_the_queue_is_written_out_at_exit():
    code = ("import logging, sys\n"
            "from fedsketch.server.cli.logformat import configure\n"
            "from fedsketch.server.service import events\n"
            "configure('text')\n"
            "events.DEFER_SECONDS = 3600\n"  # the thread never gets to it: exit must
            "for i in range(3):\n"
            "    events.defer('contribute', study='st-1', device=f'dev-{i}')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line.split("event=", 1)[1] for line in done.stderr.splitlines()] == [
        f"contribute study=st-1 device=dev-{i}" for i in range(3)]
