"""The operator's view of a coordinator: ``coordinator list``, ``status``, ``audit`` and
``close`` (registered on :data:`~fedsketch.server.cli.coordinator.coordinator_app`).

Each reads through the Operator service with the operator token, prints a table (times in UTC,
ISO 8601) or, with ``--json``, one JSON document on stdout (times as Unix seconds, null where
there is none). ``close`` exits with :data:`STUDY_FAILED_EXIT` when the study ends FAILED.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from fedsketch.common.cli import CaOpt, InsecureOpt, JsonOpt, Target
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.text import printable
from fedsketch.server.cli.errors import clean_errors
from fedsketch.server.cli.operator_link import STATE_NAMES, TokenFile, operator_stub

#: Exit status of ``coordinator close`` for a study that ends FAILED (closed without its quorum,
#: or its decoding failed); 1 stays "the command failed" (bad input, a refused call).
STUDY_FAILED_EXIT = 4
#: How often ``close --wait`` asks for the study's state (seconds).
POLL_SECONDS = 0.5

def when(t: float | None) -> str:
    """A Unix time as UTC ISO 8601 to the second ("-" for none)."""
    if not t:
        return "-"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _or_none(t: float) -> float | None:
    return t or None


def study_summary(s: pb.Study, parents: dict[str, dict] | None = None) -> dict[str, Any]:
    """What ``list`` shows of a study: its name (a refinement round's names its study), state,
    stage, roster progress (registered / quorum / roster size; none under secure aggregation,
    whose devices register at its REGISTER stage) and deadline, read from its public spec (a
    round's roster size from its study's, in ``parents`` by id, if there)."""
    spec = json.loads(s.spec_json)
    if "parent_id" in spec:  # a refinement round's (fedsketch.round/2), sketch round's or boxed study's
        name = (f"round {spec['round']} of {spec['parent_id']}" if "round" in spec else
                f"sketch round (σ = {spec['sigma']:.4g}) of {spec['parent_id']}" if "sigma" in spec
                else f"boxed study (after the box round) of {spec['parent_id']}")
        roster = (parents or {}).get(spec["parent_id"], {}).get("roster")
    else:
        name, roster = spec["name"], spec.get("roster")
    quorum = spec["min_devices"]
    return {"study_id": s.study_id, "name": name, "state": STATE_NAMES[s.state],
            "stage": pb.Stage.Name(s.stage), "registered": s.registered, "quorum": quorum,
            "roster": roster or quorum, "contributions": s.contributions, "records": s.records,
            "deadline": spec.get("deadline"), "secure": spec.get("secure_aggregation") is not None,
            "detail": s.detail}


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]], title: str | None = None) -> None:
    """A table on stdout; when stdout is no terminal (a pipe, a file), 200 columns wide, so that
    ids and times are never cut."""
    from rich.console import Console  # rich loads here, not when the CLI starts
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(printable(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def list_studies(
    coordinator: Target,
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Every study and refinement round, oldest first: its state, roster progress
    (registered/quorum/roster size), contributions and deadline. ``status`` shows one study
    in full."""
    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        studies = stub.ListStudies(pb.ListStudiesRequest(include_closed=True), metadata=meta,
                                   timeout=30).studies
    specs = {s.study_id: json.loads(s.spec_json) for s in studies}
    rows = [study_summary(s, specs) for s in studies]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    _table(("study", "name", "state", "registered/quorum/roster", "contributed", "deadline",
            "detail"),
           [(r["study_id"], r["name"], r["state"],
             "-" if r["secure"] else f"{r['registered']}/{r['quorum']}/{r['roster']}",
             str(r["contributions"]), when(r["deadline"]), r["detail"]) for r in rows])


def status_document(reply: pb.StatusReply) -> dict[str, Any]:
    """``status --json``: the study's summary, its window, ε, roster, refusals and rounds."""
    doc = study_summary(reply.study)
    window = reply.filled_at + reply.collect_seconds if reply.filled_at and reply.collect_seconds else None
    doc.update(
        created_at=reply.created_at, quorum=reply.min_devices, roster=reply.roster_size,
        filled_at=_or_none(reply.filled_at), deadline=_or_none(reply.deadline),
        collect_seconds=_or_none(reply.collect_seconds), window_ends_at=window,
        epsilon=reply.epsilon, parent_id=reply.parent_id or None, round=reply.round,
        devices=[{"device_id": e.device_id, "label": e.label, "registered_at": e.registered_at,
                  "contributed_at": _or_none(e.contributed_at)} for e in reply.roster],
        refusals=[{"device_id": f.device_id, "label": f.label,
                   "reason": pb.RefusalReason.Name(f.reason), "reported_at": f.reported_at}
                  for f in reply.refusals],
        refused=reply.refused,
        rounds=[{"round": json.loads(r.spec_json).get("round", -1 if "outcome" in r.spec_json else 0),
                 # 0: the sketch round; −1: the boxed study after a box round
                 **study_summary(r, {reply.study.study_id: {"roster": reply.roster_size}})}
                for r in reply.rounds])
    specs = [json.loads(r.spec_json) for r in reply.rounds]
    doc["calibration"] = next((x["calibration"] for x in specs if "sigma" in x), None)  # round 0's
    doc["box"] = next((x["outcome"] for x in specs if "outcome" in x), None)  # the box round's
    return doc


def _print_status(doc: dict[str, Any]) -> None:
    typer.echo(f"{doc['study_id']} {printable(doc['name'])}: {doc['state']}, stage {doc['stage']}"
               + (f" ({printable(doc['detail'])})" if doc["detail"] else ""))
    typer.echo(f"quorum: {doc['registered']} registered of {doc['quorum']} needed (roster takes "
               f"{doc['roster']}); {doc['contributions']} contributed; {doc['refused']} refused")
    window = (f"collection window {doc['collect_seconds']:g} s from the quorum ("
              + (f"ends {when(doc['window_ends_at'])})" if doc["window_ends_at"] else
                 "not started)") if doc["collect_seconds"] else "no collection window")
    typer.echo(f"created {when(doc['created_at'])}; quorum registered {when(doc['filled_at'])}; "
               f"{window}; deadline {when(doc['deadline'])}")
    typer.echo(f"ε per device: {doc['epsilon']:g}"
               + (f" (round {doc['round']} of {doc['parent_id']})" if doc["parent_id"] else ""))
    if doc["box"] is not None:
        typer.echo(f"box round: {doc['box']['explanation']}: lo {doc['box']['lo']}, hi {doc['box']['hi']}")
    if doc["calibration"] is not None:
        typer.echo(f"round 0 chose {doc['calibration']['explanation']}")
    if doc["devices"]:
        _table(("device", "label", "registered", "contributed"),
               [(d["device_id"], d["label"], when(d["registered_at"]), when(d["contributed_at"]))
                for d in doc["devices"]], "registered devices")
    if doc["refusals"]:
        _table(("device", "label", "reason", "reported"),
               [(f["device_id"], f["label"], f["reason"], when(f["reported_at"]))
                for f in doc["refusals"]], "refusals reported by devices")
    if doc["rounds"]:
        _table(("round", "study", "state", "registered/quorum/roster", "contributed", "detail"),
               [(str(r["round"]), r["study_id"], r["state"],
                 f"{r['registered']}/{r['quorum']}/{r['roster']}", str(r["contributions"]),
                 r["detail"]) for r in doc["rounds"]], "rounds (0: the sketch after round 0)")


def status(
    coordinator: Target,
    study: Annotated[str, typer.Argument(help="Study id.")],
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    limit: Annotated[int, typer.Option(help="Most roster devices and refusals listed (the "
                                       "counts cover all).")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """One study as the operator watches it: state and stage; quorum progress (registered of
    the quorum, the roster size, contributed, refused); when the quorum registered, the
    collection window and the deadline; the ε one device spends; each registered device
    (label, registered and contributed times); each refusal a device reported, with its
    reason code (BUDGET, POLICY, TOO_FEW_RECORDS, TOO_MANY_RECORDS, DATA_UNREADABLE,
    DIMENSION_MISMATCH, SPEC_MISMATCH, OTHER; devices of earlier releases report none); and
    the study's rounds with their states: with --scale auto, the σ its round 0 chose and why,
    and its sketch round (numbered 0), then the refinement rounds."""
    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        reply = stub.StudyStatus(pb.StatusRequest(study_id=study, limit=limit), metadata=meta,
                                 timeout=30)
    doc = status_document(reply)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print_status(doc)


def audit(
    coordinator: Target,
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    limit: Annotated[int, typer.Option(help="Newest rows shown (at most 10000).")] = 100,
    study: Annotated[str | None, typer.Option(help="Only rows of this study and its refinement "
                                              "rounds.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The coordinator's audit log, oldest of the newest --limit rows first: when, who (a device
    id, "operator" or "coordinator"), what (enroll, create_study, register, leave, contribute,
    refuse, request_close, set_state, put_result, migrate, ...) and its detail."""
    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        entries = stub.Audit(pb.AuditRequest(limit=limit, study_id=study or ""), metadata=meta,
                             timeout=30).entries
    rows = [{"at": e.at, "actor": e.actor, "action": e.action, "detail": e.detail} for e in entries]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{when(r['at'])}  {printable(r['actor'])}  {r['action']}  {printable(r['detail'])}")


def close_study(
    coordinator: Target,
    study: Annotated[str, typer.Argument(help="Study id.")],
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the study to end (DONE or "
                                        "FAILED: decoding, refinement rounds and devices "
                                        "holding an input ticket take time); 0: do not wait.")]
    = 0.0,
) -> None:
    """Stop collecting now: decode if the quorum holds, otherwise fail the study. Prints the
    study's state; exits with status 4 if the study is FAILED (at once, or by the end of
    --wait), 1 if the close is refused or --wait passes before the study ends, 0 otherwise."""
    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        s = stub.CloseStudy(pb.StudyRef(study_id=study), metadata=meta, timeout=30)
        stop = time.monotonic() + wait
        while wait > 0 and s.state not in (pb.DONE, pb.FAILED):
            if time.monotonic() >= stop:
                raise ValueError(f"study {study} is still {STATE_NAMES[s.state]} after {wait:g} s "
                                 f"({s.detail})")
            time.sleep(POLL_SECONDS)
            s = stub.ShowStudy(pb.StudyRef(study_id=study), metadata=meta, timeout=30)
    typer.echo(f"{s.study_id}: {STATE_NAMES[s.state]} {printable(s.detail)}".rstrip())
    if s.state == pb.FAILED:
        raise typer.Exit(STUDY_FAILED_EXIT)
