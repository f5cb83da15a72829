"""The serve log's two line formats: key=value text that splits back into its pairs, and JSON
lines with the same keys."""

from __future__ import annotations

import io
import json
import logging
import shlex

import pytest

from fedsketch.server.cli.logformat import JsonFormatter, TextFormatter, configure
from fedsketch.server.service.events import emit


@pytest.fixture
def captured():
    """The events logger writing into a buffer through the formatter the test sets."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("fedsketch.events")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield out, handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_an_event_is_one_line_of_pairs_that_split_back(captured):
    out, handler = captured
    handler.setFormatter(TextFormatter())
    emit("state", study="st-1", state="failed", detail='closed by "x" = y\nz', parent=None)
    (line,) = out.getvalue().splitlines()
    pairs = dict(p.split("=", 1) for p in shlex.split(line))  # JSON strings are shell-quotable here
    assert (pairs["event"], pairs["study"], pairs["state"], pairs["parent"]) == (
        "state", "st-1", "failed", "null")
    assert pairs["level"] == "info" and pairs["logger"] == "fedsketch.events"
    assert pairs["ts"].endswith("Z")
    assert json.loads(line.split(" detail=", 1)[1].split(" parent=")[0]) == 'closed by "x" = y\nz'


def test_json_lines_carry_the_same_keys_and_other_records_a_message(captured):
    out, handler = captured
    handler.setFormatter(JsonFormatter())
    emit("register", study="st-1", device="dev-1", registered=2, quorum=2, roster=3)
    logging.getLogger("fedsketch.events").warning("plain %s", "text")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("event", "study", "device", "registered", "quorum", "roster")} == {
        "event": "register", "study": "st-1", "device": "dev-1", "registered": 2, "quorum": 2,
        "roster": 3}
    assert (second["level"], second["msg"]) == ("warning", "plain text") and "event" not in second


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="--log-format must be one of text, json"):
        configure("xml")
