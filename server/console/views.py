"""The console's HTML, rendered on the server from the operator's reads: the same replies
``coordinator list``, ``status``, ``audit`` and ``result`` print
(:mod:`fedsketch.server.service.operator_view`, :mod:`fedsketch.server.cli.operator_view`), so the
page shows nothing the operator token could not read already. Every value, whoever wrote it (a
study's name, a device's label, a refusal's detail), goes through :func:`esc`; the page has no
script, and its Content-Security-Policy (:mod:`.page`) allows none.
"""

from __future__ import annotations

import json
from collections import Counter
from html import escape
from typing import Any

import numpy as np

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.cli.operator_view import status_document, study_summary, when
from fedsketch.server.console.svg import centroid_svg
from fedsketch.server.errors import Refusal
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.operator_view import audit_reply, status_reply
from fedsketch.server.service.study_wire import study_message

#: Audit rows on the front page and on a study's page.
AUDIT_ROWS = 100

STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.frame{fill:#fafafa;stroke:#ccc}
circle.centroid{fill:#3b6ea5;fill-opacity:.6;stroke:#1d3c5e}text{font-size:11px}
form.inline{display:inline}.error{color:#a00}"""


def esc(value: Any) -> str:
    """``value`` as text, escaped for HTML (quotes too)."""
    return escape(str(value), quote=True)


def document(title: str, body: str, logged_in: bool = True) -> str:
    """A whole page."""
    logout = ('<form class="inline" method="post" action="/logout"><button>Log out</button></form>'
              if logged_in else "")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<style>{STYLE}</style></head><body><p><a href="/">fedsketch coordinator</a> {logout}</p>'
            f"<h1>{esc(title)}</h1>{body}</body></html>")


def table(columns: tuple[str, ...], rows: list[tuple[Any, ...]], raw: frozenset[int] = frozenset(),
          table_id: str = "") -> str:
    """A table; the cells of the columns in ``raw`` are markup made here, every other one is escaped."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{v if i in raw else esc(v)}</td>" for i, v in enumerate(row))
                   + "</tr>" for row in rows)
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{ident}><tr>{head}</tr>{body or ''}</table>"


def login_page(message: str = "") -> str:
    """The login form: the token is posted in the request body, never put in a URL."""
    note = f'<p class="error">{esc(message)}</p>' if message else ""
    form = ('<form method="post" action="/login"><label>Operator token '
            '<input type="password" name="token" id="token" autocomplete="current-password">'
            '</label> <button id="login" type="submit">Log in</button></form>')
    return document("Log in", note + form, logged_in=False)


def _audit(c: Coordinator, study_id: str = "") -> str:
    rows = [(when(e.at), e.actor, e.action, e.detail)
            for e in audit_reply(c, AUDIT_ROWS, study_id).entries]
    return table(("at (UTC)", "actor", "action", "detail"), rows, table_id="audit")


def front_page(c: Coordinator) -> str:
    """Every study with its state and roster progress, then the newest audit rows."""
    studies = [study_message(r, c.round_of(r.study_id)) for r in c.studies(include_closed=True)]
    specs = {s.study_id: json.loads(s.spec_json) for s in studies}
    rows = []
    for s in map(lambda s: study_summary(s, specs), studies):
        link = f'<a href="/study/{esc(s["study_id"])}">{esc(s["study_id"])}</a>'
        roster = "-" if s["secure"] else f'{s["registered"]}/{s["quorum"]}/{s["roster"]}'
        rows.append((link, s["name"], s["state"], s["stage"], roster, s["contributions"],
                     when(s["deadline"]), s["detail"]))
    return document("Studies", table(("study", "name", "state", "stage", "registered/quorum/roster",
                                      "contributed", "deadline (UTC)", "detail"), rows,
                                     raw=frozenset({0}), table_id="studies")
                    + "<h2>Audit trail</h2>" + _audit(c))


def study_page(c: Coordinator, study_id: str) -> str:
    """One study: its state, roster and quorum progress, secure stage, rounds, refusals by
    reason, its audit trail and, once done, its result with the centroids' picture. A Refusal
    (unknown study) passes to the caller."""
    doc = status_document(status_reply(c, study_id, 0))
    facts = [("state", doc["state"]), ("name", doc["name"]), ("detail", doc["detail"] or "-"),
             ("created", when(doc["created_at"])), ("deadline", when(doc["deadline"])),
             ("quorum registered", when(doc["filled_at"])),
             ("collection window ends", when(doc["window_ends_at"])),
             ("registered / quorum / roster", f'{doc["registered"]} / {doc["quorum"]} / {doc["roster"]}'),
             ("contributions", doc["contributions"]), ("ε per device", f'{doc["epsilon"]:g}')]
    if doc["secure"]:
        facts += _secure_facts(c, study_id, doc["stage"])
    parts = [table(("", ""), facts, table_id="facts")]
    parts.append("<h2>Roster</h2>" + table(
        ("device", "label", "registered (UTC)", "contributed (UTC)"),
        [(d["device_id"], d["label"], when(d["registered_at"]), when(d["contributed_at"]))
         for d in doc["devices"]], table_id="roster"))
    if doc["rounds"]:
        parts.append("<h2>Rounds</h2>" + table(
            ("round", "study", "state", "stage", "contributed", "detail"),
            [(r["round"], r["study_id"], r["state"], r["stage"], r["contributions"], r["detail"])
             for r in doc["rounds"]], table_id="rounds"))
    reasons = Counter(f["reason"] for f in doc["refusals"])
    parts.append(f'<h2>Refusals ({doc["refused"]})</h2>' + table(
        ("reason", "devices"), sorted(reasons.items()), table_id="refusals"))
    if doc["state"] == pb.StudyState.Name(pb.DONE) and doc["parent_id"] is None:
        parts.append(_result(c, study_id))
    parts.append("<h2>Audit trail</h2>" + _audit(c, study_id))
    return document(f"Study {study_id}", "".join(parts))


def _secure_facts(c: Coordinator, study_id: str, stage: str) -> list[tuple[str, Any]]:
    """A secure round's progress: the open stage, when it opened, the messages it holds and when
    it closes at the latest (its ``stage_timeout``); once ended, who is in the sum. REGISTER,
    before any other stage opened, has no opening time of its own (its clock starts with the
    first registration)."""
    kept = c.store.secure_round(study_id)
    if kept is not None and kept.ended:
        members = kept.members or {}
        return [("secure round", "ended"),
                ("in the sum", f"{sum(members.values())} of {len(members)} devices, "
                 f"{kept.records:g} records" if kept.total is not None else "nothing (no sum)")]
    facts: list[tuple[str, Any]] = [("secure stage", stage)]
    number = pb.Stage.Value(stage)
    facts.append(("messages at this stage", len(c.store.stage_messages(study_id, (number,)))))
    if kept is not None:
        timeout = getattr(getattr(c.spec(study_id), "secure_aggregation", None), "stage_timeout", None)
        facts.append(("stage opened", when(kept.opened_at)))
        if timeout is not None:
            facts.append(("stage closes at the latest", when(kept.opened_at + timeout)))
    return facts


def _result(c: Coordinator, study_id: str) -> str:
    """A done study's published result: the picture, the centroids and the verdict."""
    try:
        _, result = c.result(study_id)
    except Refusal as exc:
        return f'<h2>Result</h2><p class="error">{esc(exc.message)}</p>'
    centroids, weights = np.asarray(result["centroids"], float), np.asarray(result["weights"], float)
    verdict = result.get("identifiability", {})
    rows = [(j + 1, f"{w:.4g}", ", ".join(f"{v:.4g}" for v in row))
            for j, (row, w) in enumerate(zip(centroids, weights, strict=True))]
    try:
        picture = centroid_svg(centroids, weights)
    except ValueError as exc:
        picture = f'<p class="error">{esc(exc)}</p>'
    quality = result.get("verdict") or {}
    return ("<h2>Result</h2>" + f'<p>{esc(result.get("devices"))} devices, '
            f'{esc(result.get("records"))} records; verdict on the centroids: '
            f'<span id="verdict">{esc(quality.get("status", "-"))}</span> '
            f'{esc(quality.get("reason", ""))}</p>'
            f'<p>identifiability of the sketch\'s start: '
            f'<span id="identifiability">{esc(verdict.get("status", "-"))}</span> '
            f'{esc(verdict.get("reason", ""))}</p>'
            + picture
            + table(("centroid", "weight", "coordinates"), rows, table_id="centroid-table"))
