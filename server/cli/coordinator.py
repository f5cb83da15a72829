"""``fedsketch coordinator``: the operator's commands, assembled here into :data:`coordinator_app`:
``serve``, ``tokens`` and ``result`` defined here, ``create-study`` (:mod:`.create_study`) and the
operator's view (:mod:`.operator_view`: list, status, audit, close); ``fedsketch certs`` is
:mod:`.certs`, and what the operator's commands share is :mod:`.operator_link`.

Options an operator sets once (the coordinator's address, the CA, the token file, and every option
of ``serve``) are also read from ``FEDSKETCH_*`` environment variables (named in each ``--help``),
so a systemd unit can take them from an ``EnvironmentFile`` (see ``deploy/``); a flag on the
command line wins over the environment.

Errors follow the rest of the CLI: one line on stderr (``error: ...``) and exit status 1. A gRPC
refusal prints its status code and the coordinator's reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.cli import CaOpt, InsecureOpt, Target, stop_on_signals
from fedsketch.common.helptext import TidyGroup
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.cli.create_study import create_study
from fedsketch.server.cli.errors import NOT_IDENTIFIABLE_EXIT, clean_errors, report_verdict
from fedsketch.server.cli.health import health
from fedsketch.server.cli.operator_link import TokenFile, operator_stub, read_token
from fedsketch.server.cli.operator_view import audit, close_study, list_studies, status
from fedsketch.server.cli.planning import result_noise


def serve(
    db: Annotated[str, typer.Option(
        envvar="FEDSKETCH_DB", metavar="<path|url>",
        help="Where the coordinator's state lives: a SQLite file (created if missing; one "
        "coordinator per file), or a PostgreSQL database, postgresql://[USER@]HOST[:PORT]/DATABASE "
        "(needs the postgres extra; tables created in an empty database); one coordinator "
        "serves one database, as one file, unless each is started with --shared. Leave the "
        "password out of the URL: it is read from PGPASSWORD or the password file (PGPASSFILE, "
        "default ~/.pgpass), and never printed.")],
    listen: Annotated[str, typer.Option(envvar="FEDSKETCH_LISTEN", help="HOST:PORT to listen on.")] = (
        "127.0.0.1:7443"),
    cert: Annotated[Path | None, typer.Option(
        envvar="FEDSKETCH_CERT", help="Server certificate (PEM). A device's signed reads must name "
        "one of its hosts (the host of the device's --coordinator).")] = None,
    key: Annotated[Path | None, typer.Option(envvar="FEDSKETCH_KEY",
                                             help="Server private key (PEM).")] = None,
    insecure: InsecureOpt = False,
    token_file: Annotated[Path, typer.Option("--token-file", envvar="FEDSKETCH_OPERATOR_TOKEN_FILE",
                                             help="Operator token file; "
                                             "created (mode 0600) with a fresh token if "
                                             "missing.")] = Path("operator.token"),
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port here once "
                                                   "serving (for port 0).")] = None,
    shared: Annotated[bool, typer.Option(
        "--shared", envvar="FEDSKETCH_SHARED",
        help="Serve a PostgreSQL --db together with other coordinators started with --shared "
        "(behind one address, or with devices split between them): any of them takes any "
        "device's message, and each study is closed, decoded and published once. Secure-"
        "aggregation studies too: any of them takes any device's stage message, checked "
        "against the round the database holds, and each stage closes once.")] = False,
    db_readers: Annotated[bool, typer.Option(
        "--db-readers", envvar="FEDSKETCH_DB_READERS",
        help="Let other processes read a SQLite --db while it serves (WAL's shared-memory "
        "index in <db>-shm). Without it the coordinator holds the file alone and keeps that "
        "index in its own memory, so a -shm file that another process truncates or makes "
        "unwritable cannot crash it (SIGBUS).")] = False,
    log_format: Annotated[str, typer.Option(
        envvar="FEDSKETCH_LOG_FORMAT", help="How stderr's log lines are written: 'text' "
        "(key=value pairs) or 'json' (one JSON object a line).")] = "text",
    metrics: Annotated[str | None, typer.Option(
        envvar="FEDSKETCH_METRICS", metavar="HOST:PORT",
        help="Expose Prometheus metrics at http://HOST:PORT/metrics (off unless given; keep it "
        "on loopback or a monitoring network: docs/operator-console.md).")] = None,
    helper_token_file: Annotated[Path | None, typer.Option(
        "--helper-token-file", envvar="FEDSKETCH_HELPER_TOKEN_FILE",
        help="The token file `helper serve` wrote (a copy from the helper's operator): with it "
        "the coordinator creates and runs studies validated by that helper "
        "(create-study --validation helper).")] = None,
    console: Annotated[str | None, typer.Option(
        envvar="FEDSKETCH_CONSOLE", metavar="HOST:PORT",
        help="Serve the read-only operator console at HOST:PORT (HTTPS with --cert/--key, HTTP "
        "with --insecure); it asks for the operator token (off unless given).")] = None,
) -> None:
    """Serve the Device and Operator gRPC services until SIGTERM or SIGINT.

    Logs one line on stderr for each enrollment, registration, leave, contribution, refusal a
    device reports, close request, secure-aggregation stage and state change (``event=...`` with
    ids, states, reason codes and counts; never a payload), and for each decoding. Started on a
    database it served before, it resumes where it stopped: studies left decoding are decoded
    again (a secure one from its stored unmasked sum) and secure-aggregation rounds go on at the
    stage they were in, their deadlines counted from when each stage opened. Every request is parsed from raw
    bytes under its method's size limit; malformed input is refused with INVALID_ARGUMENT. An
    internal error answers INTERNAL with a short error id, logged here with its traceback; a
    store that cannot write (full disk, read-only or failing file, lost database) answers
    RESOURCE_EXHAUSTED or UNAVAILABLE naming the cause, logged here with the file, and reads
    go on.
    Studies and results are not public: the operator token reads them all, an enrolled device
    (signing each read) the studies it may join and the results of those it contributed to.
    The standard gRPC health service answers on the same port: SERVING while the store answers.
    --metrics and --console start the operator's console (docs/operator-console.md)."""
    from fedsketch.common.net.tls import server_tls
    from fedsketch.server.cli.logformat import configure
    from fedsketch.server.console.serve import Console
    from fedsketch.server.service.api import build_server
    from fedsketch.server.store import open_store, sqlite_path
    from fedsketch.server.store.filelock import hold_exclusive

    log = logging.getLogger("fedsketch.coordinator")
    with clean_errors():
        configure(log_format)
        if insecure == (cert is not None or key is not None):
            raise ValueError("give --cert and --key for TLS, or --insecure (not both)")
        if not insecure and (cert is None or key is None):
            raise ValueError("TLS needs both --cert and --key")
        tls = None if insecure else server_tls(cert, key)
        Console.check(metrics, console)
        db_file = sqlite_path(db)  # None: a PostgreSQL database, which coordinators may share
        files = ([] if db_file is None else [("--db", Path(db_file))]) + [("--token-file", token_file)]
        for option, path in files:
            if not path.parent.is_dir():  # before the store is created
                raise ValueError(f"{option} {path}: folder {path.parent} does not exist")
        if db_file is not None and shared:
            raise ValueError(f"--shared needs a postgresql:// --db; {db} is a SQLite file, which "
                             "one coordinator serves")
        if db_file is not None:
            hold_exclusive(db_file)  # first: a file another coordinator serves is refused
        store = open_store(db, exclusive=not db_readers)
        if db_file is None:
            store.hold(shared)
        if not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32) + "\n")
            log.info("wrote a new operator token to %s", token_file)
        token_sha256 = hashlib.sha256(read_token(token_file).encode()).hexdigest()
        watch = Console(store, metrics, console)
        helper_token = None if helper_token_file is None else read_token(helper_token_file)
        server, coordinator, port = build_server(watch.store, token_sha256, listen, tls,
                                                 interceptors=watch.interceptors,
                                                 add_more=watch.health.add_to,
                                                 helper_token=helper_token)
        watch.start(coordinator, token_sha256, None if insecure else (cert, key))
    stop = stop_on_signals()
    if port_file is not None:
        port_file.write_text(f"{port}\n")
    log.info("coordinator serving on port %d (%s)", port, "plaintext" if insecure else "TLS")
    stop.wait()
    watch.health.stop()
    server.stop(grace=5).wait()
    watch.stop()
    coordinator.stop()
    store.close()


def tokens(
    coordinator: Target,
    count: Annotated[int, typer.Option(help="How many one-time enrollment tokens.")] = 1,
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
) -> None:
    """Issue one-time enrollment tokens, one per line."""
    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        for token in stub.IssueTokens(pb.IssueTokensRequest(count=count), metadata=meta,
                                      timeout=30).tokens:
            typer.echo(token)


def result(
    coordinator: Target,
    study: Annotated[str, typer.Argument(help="Study id.")],
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    strict: Annotated[bool, typer.Option(
        help=f"Exit with status {NOT_IDENTIFIABLE_EXIT} when the verdict on the centroids is "
             "\"unreliable\".")] = False,
) -> None:
    """The published centroids of a study, as JSON (as ``decode --json`` prints them), with
    "verdict": one verdict on the centroids returned ("good", "usable, with caveats" or
    "unreliable", with its reason, also on stderr unless good, and the numbers it read), judged
    after the refinement rounds where there are any (from the last round's noisy counts and
    sums), and as a detail "identifiability": whether the sketch's start stood above the
    aggregate's noise; "refined_rounds" says how many rounds ended with new centres. "noise_norm" is
    the norm the aggregate sketch's noise is expected to have (from the public spec and the
    released counts, sketch units), and stderr says how much of "residual" it explains. With
    --scale auto, "calibration" is round 0's choice of σ and its "explanation" (else null); with
    --bounds auto, "box" is the box the study's box round read (lo, hi, ε, "explanation"; else
    null).
    Results are not public: reading one takes the operator token (a device reads the results of
    the studies it contributed to with its own signature)."""
    from fedsketch.common.study.study import StudySpec

    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        res = stub.GetResult(pb.StudyRef(study_id=study), metadata=meta, timeout=30)
        spec = StudySpec.from_json(stub.ShowStudy(pb.StudyRef(study_id=study), metadata=meta,
                                                  timeout=30).spec_json)
    noise_norm = result_noise(spec, res.residual, res.devices, res.records)
    c = [list(res.centroids[i * res.d:(i + 1) * res.d]) for i in range(res.k)]
    verdict = {"status": res.status, "reason": res.status_reason, "z": list(res.z),
               "threshold": res.threshold}
    judged = json.loads(res.verdict_json) if res.verdict_json else None
    report_verdict(judged, strict, lambda: typer.echo(json.dumps(
        {"centroids": c, "weights": list(res.weights), "residual": res.residual, "noise_norm": noise_norm,
         "devices": res.devices, "records": res.records, "verdict": judged, "identifiability": verdict,
         "refined_rounds": res.rounds,
         "calibration": json.loads(res.calibration_json) if res.calibration_json else None,
         "box": json.loads(res.box_json) if res.box_json else None})))


coordinator_app = typer.Typer(cls=TidyGroup, no_args_is_help=True, help="Run and operate a coordinator.")
coordinator_app.command("serve")(serve)
coordinator_app.command("tokens")(tokens)
coordinator_app.command("result")(result)
coordinator_app.command("create-study")(create_study)
coordinator_app.command("list")(list_studies)
coordinator_app.command("status")(status)
coordinator_app.command("audit")(audit)
coordinator_app.command("close")(close_study)
coordinator_app.command("health")(health)
