"""``fedsketch coordinator``: the operator's commands (``fedsketch certs`` is :mod:`.certs`).

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
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.choices import (
    COLLECT_SECONDS,
    DEADLINE_SECONDS,
    DEFAULT_MAX_DEVICE_RECORDS,
    DEFAULT_R,
    FEATURES,
    LAWS,
    NEIGHBOURING,
    ROUND_SECONDS,
    ROUND_SHARE,
    ROUNDS,
)
from fedsketch.common.cli import CaOpt, InsecureOpt, JsonOpt, Target, connect
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.cli.errors import NOT_IDENTIFIABLE_EXIT, clean_errors, report_identifiability
from fedsketch.server.cli.planning import ExpectedRecordsOpt, StrictPlanOpt, report_plan, result_noise

coordinator_app = typer.Typer(no_args_is_help=True, help="Run and operate a coordinator.")

TokenFile = Annotated[Path, typer.Option("--token-file", envvar="FEDSKETCH_OPERATOR_TOKEN_FILE",
                                         help="File holding the operator token: the one `coordinator "
                                         "serve` wrote (its --token-file, by default operator.token "
                                         "in the folder it runs in).")]
STATE_NAMES = {v: k for k, v in pb.StudyState.items()}


def read_token(path: Path) -> str:
    """The operator token stored in ``path`` (one line); a missing, unreadable or empty file is
    refused naming --token-file and where ``serve`` writes it."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"--token-file {path}: cannot read the operator token "
                         f"({exc.strerror or exc}); `coordinator serve` writes it to its own "
                         "--token-file (default operator.token in the folder it runs in): give "
                         "that file's path") from None
    if not token:
        raise ValueError(f"--token-file {path}: empty operator token file")
    return token


def operator_stub(target: str, ca: Path | None, insecure: bool, token_file: Path):
    """(Operator stub, call metadata) for admin calls."""
    from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc

    meta = (("authorization", f"Bearer {read_token(token_file)}"),)
    return pb_grpc.OperatorStub(connect(target, ca, insecure)), meta


@coordinator_app.command("serve")
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
    cert: Annotated[Path | None, typer.Option(envvar="FEDSKETCH_CERT",
                                              help="Server certificate (PEM).")] = None,
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
        "device's message, and each study is closed, decoded and published once. Plain "
        "studies only: these coordinators refuse secure-aggregation studies, whose rounds "
        "live in one process's memory.")] = False,
    log_format: Annotated[str, typer.Option(
        envvar="FEDSKETCH_LOG_FORMAT", help="How stderr's log lines are written: 'text' "
        "(key=value pairs) or 'json' (one JSON object a line).")] = "text",
) -> None:
    """Serve the Device and Operator gRPC services until SIGTERM or SIGINT.

    Logs one line on stderr for each enrollment, registration, leave, contribution, refusal a
    device reports, close request, secure-aggregation stage and state change (``event=...`` with
    ids, states, reason codes and counts; never a payload), and for each decoding. Started on a
    database it served before, it resumes where it stopped: studies left decoding are decoded
    again (a secure one from its stored unmasked sum) and secure-aggregation rounds go on at the
    stage they were in, their deadlines counted from when each stage opened. Every request is parsed from raw
    bytes under its method's size limit; malformed input is refused with INVALID_ARGUMENT. An
    internal error answers INTERNAL with a short error id, logged here with its traceback.
    Studies and results are not public: the operator token reads them all, an enrolled device
    (signing each read) the studies it may join and the results of those it contributed to."""
    from fedsketch.common.tls import server_credentials
    from fedsketch.server.cli.logformat import configure
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
        creds = None if insecure else server_credentials(cert, key)
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
        store = open_store(db)
        if db_file is None:
            store.hold(shared)
        if not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32) + "\n")
            log.info("wrote a new operator token to %s", token_file)
        token_sha256 = hashlib.sha256(read_token(token_file).encode()).hexdigest()
        server, coordinator, port = build_server(store, token_sha256, listen, creds)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if port_file is not None:
        port_file.write_text(f"{port}\n")
    log.info("coordinator serving on port %d (%s)", port, "plaintext" if insecure else "TLS")
    stop.wait()
    server.stop(grace=5).wait()
    coordinator.stop()
    store.close()


@coordinator_app.command("create-study")
def create_study(
    coordinator: Target,
    name: Annotated[str, typer.Option(help="Study name.")],
    d: Annotated[int, typer.Option(help="Dimension of the records.")],
    k: Annotated[int, typer.Option(help="Number of centroids.")],
    bounds: Annotated[str, typer.Option(help="Public box LO:HI or a bounds.json.")],
    scale: Annotated[float, typer.Option(
        help="σ in data units (public). Required here, while `sketch` defaults to --scale auto: a "
             "federated study's private auto scale needs a calibration round across the devices, "
             "which is not built yet; pick σ from public knowledge of the data's spread, or with "
             "`fedsketch sketch --scale auto` on data you may spend on.")],
    epsilon: Annotated[float, typer.Option(help="ε each device spends in all, its sketch and "
                                           "every refinement round (finite, > 0).")],
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    m: Annotated[int, typer.Option(help="Frequencies.")] = 1000,
    feature: Annotated[str, typer.Option(help=f"{', '.join(FEATURES)}.")] = "complex",
    law: Annotated[str, typer.Option(help=f"{', '.join(LAWS)}.")] = "adapted_radius",
    seed: Annotated[int, typer.Option(help="Public seed of Ω and ξ.")] = 0,
    r: Annotated[int, typer.Option(help="Entries per record, 1..m (default 1, as in every "
                                   "command; see `sketch --help`).")] = DEFAULT_R,
    delta: Annotated[float, typer.Option(help="δ (> 0: Gaussian).")] = 0.0,
    neighbouring: Annotated[str, typer.Option(help=f"{' or '.join(NEIGHBOURING)}.")] = (
        "replace_one"),
    min_devices: Annotated[int, typer.Option(help="Quorum: the fewest devices whose releases "
                                             "the study decodes.")] = 1,
    roster: Annotated[int | None, typer.Option(
        help="Most devices the roster takes (at least --min-devices, the default). Devices "
        "start once the quorum has registered; later ones may still join, so a roster device "
        "that never sends does not fail the study.")] = None,
    collect_seconds: Annotated[float | None, typer.Option(
        help="Seconds the study collects once its quorum has registered; then it decodes if "
        f"--min-devices have sent, else fails. Default {COLLECT_SECONDS:g} for a plain study; "
        "not with --secure-aggregation, whose stages end by --stage-timeout.")] = None,
    min_records: Annotated[int, typer.Option(
        help="Records a device needs (replace-one only: under add/remove n is private).")] = 1,
    max_device_records: Annotated[int | None, typer.Option(
        help="Public cap on the records one device may hold, so the most weight one device "
        "(hostile or not) carries in the average; a device with more refuses the study, saying "
        f"why, and spends nothing. Default {DEFAULT_MAX_DEVICE_RECORDS:,} (under "
        "--secure-aggregation at most --max-records).")] = None,
    deadline: Annotated[float | None, typer.Option(
        help="Seconds from now after which the study stops collecting, whatever else (then it "
        "decodes if --min-devices have sent, else fails); it closes sooner once its whole roster "
        f"has sent. Default {DEADLINE_SECONDS:g} (a week) for a plain study, so one whose quorum "
        "never registers ends; not with --secure-aggregation.")] = None,
    replicates: Annotated[int, typer.Option(help="CL-OMPR replicates.")] = 3,
    secure_aggregation: Annotated[bool, typer.Option(
        "--secure-aggregation", help="Secure aggregation with distributed DLap noise "
        "(replace-one, pure ε).")] = False,
    max_dropout: Annotated[float | None, typer.Option(
        help="Fraction of the --min-devices roster that may drop out (secure aggregation; "
        "required): D = ⌈fraction·L⌉.")] = None,
    max_colluders: Annotated[float | None, typer.Option(
        help="Fraction that may collude with the coordinator (secure aggregation; required): "
        "C = ⌈fraction·L⌉.")] = None,
    threshold: Annotated[int | None, typer.Option(
        help="Shamir threshold t (default: the smallest safe one).")] = None,
    max_records: Annotated[int | None, typer.Option(help="Public bound on the total records "
                                                    "(sizes the modulus).")] = None,
    degree: Annotated[int | None, typer.Option(help="Neighbours per device (SecAgg+).")] = None,
    stage_timeout: Annotated[float, typer.Option(help="Seconds per stage, from when it opened "
                                                 "(a coordinator restart does not reset it).")] = 30.0,
    rounds: Annotated[int, typer.Option(
        help="Refinement rounds after the sketch: private Lloyd steps across the devices, each "
        "a study of its own with its own roster, whose sums are offsets from the centres "
        "clipped to half the box; 0: the sketch alone.")] = ROUNDS,
    round_share: Annotated[float, typer.Option(
        help="Share of --epsilon the refinement rounds take together, in equal parts.")]
    = ROUND_SHARE,
    round_seconds: Annotated[float, typer.Option(
        help="Seconds each refinement round collects at most (it ends sooner once its roster "
        "has sent).")] = ROUND_SECONDS,
    expected_records: ExpectedRecordsOpt = None,
    strict: StrictPlanOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a study and print its id. A study that could overflow its secure-aggregation
    modulus, or that secure aggregation cannot serve, is refused with the reason.

    With --rounds T, the sketch's centroids are refined by T private Lloyd rounds across the
    devices once the sketch is decoded; the devices spend --epsilon in all (the sketch
    (1 − share)·ε, each round share·ε/T), and the result is published after the last round.

    Secure aggregation states its assumptions. Of the L = --min-devices roster, at most
    D = ⌈max-dropout·L⌉ devices drop out and at most C = ⌈max-colluders·L⌉ collude with the
    coordinator. Then: (1) every device adds 1/h_min of one discrete-Laplace draw,
    h_min = L − D − C; the sum is unmasked only over a survivor list of at least L − D masked
    inputs, of which at most C shares are known to the coordinator, so at least h_min unknown
    shares, one full draw, protect the sum (refused if h_min < 1); (2) a coordinator that tells
    a device and some of its neighbours that it survived, and the other neighbours that it
    dropped, could collect both of its secrets and unmask it alone, unless 2t > |N(u)| + 1 +
    colluders among them (|N(u)| = L − 1, or --degree, plus one when the degree and the roster
    are odd); (3) t must be small enough that D dropouts leave t share holders in every
    neighbourhood, so a round within its assumptions finishes; (4) devices reveal shares only
    against q = ⌊(p + C)/2⌋ + 1 signatures on the survivor list from a public committee of
    p = min(L, 2D + C + 1) devices, so the list is unique, which needs L > 2D + C (implied by
    2 and 3); (5) a sparse graph needs --degree > C + D, or a device whose neighbours all
    collude or drop would be read alone. Devices take the enrolled keys from the
    coordinator: against one that deviates, (4) and (5) hold only if the keys are the
    devices' own. The chosen D, C, h_min and t are printed on stderr.

    With --expected-records n, the planner (fedsketch.common.planner) predicts on stderr the z
    (noise standard deviations) at which each centroid's atom should stand in the aggregate of
    --min-devices sketches of n records, against the threshold the decoder will hold it to, and
    says "expected to work", "doubtful" or "hopeless"; the last two are warnings, and with
    --strict refusals."""
    import time

    from fedsketch.common.frequencies import FrequencySpec
    from fedsketch.common.privacy import PrivacySpec
    from fedsketch.common.refine import split_study_epsilon
    from fedsketch.common.secagg.spec import SecAggSpec
    from fedsketch.common.secagg.trust import Assumptions
    from fedsketch.common.spec import SketchSpec
    from fedsketch.common.study import StudySpec
    from fedsketch.server.cli.bounds import parse_bounds

    with clean_errors():
        lo, hi = parse_bounds(bounds, d)
        sketch_eps, refine = split_study_epsilon(epsilon, rounds, round_share, round_seconds)
        sketch = SketchSpec(FrequencySpec(d=d, m=m, scale=scale, law=law, seed=seed), feature,
                            r, PrivacySpec(sketch_eps, delta, neighbouring))
        secure = None
        given = [flag for flag, value in (("--max-records", max_records),
                                          ("--max-dropout", max_dropout),
                                          ("--max-colluders", max_colluders),
                                          ("--threshold", threshold), ("--degree", degree))
                 if value is not None]
        if secure_aggregation:
            if max_records is None or max_dropout is None or max_colluders is None:
                raise ValueError("--secure-aggregation needs --max-records, and the assumptions "
                                 "--max-dropout and --max-colluders (fractions of the devices; "
                                 "see --help)")
            secure = SecAggSpec.assuming(
                Assumptions.from_fractions(min_devices, max_dropout, max_colluders), max_records,
                degree, stage_timeout, threshold)
        elif given:
            raise ValueError(f"{', '.join(given)} apply to --secure-aggregation only")
        if secure is None:
            collect_seconds = COLLECT_SECONDS if collect_seconds is None else collect_seconds
            deadline = DEADLINE_SECONDS if deadline is None else deadline
        spec = StudySpec.create(name, sketch, k, lo.tolist(), hi.tolist(), roster=roster,
                                collect_seconds=collect_seconds,
                                min_devices=min_devices, min_records=min_records,
                                max_device_records=max_device_records,
                                deadline=None if deadline is None else time.time() + deadline,
                                replicates=replicates, secure_aggregation=secure, refine=refine)
        spec.check_new()
        report_plan(spec, expected_records, strict)
        if refine is not None:
            typer.echo(f"ε = {epsilon:g} per device: the sketch {sketch_eps:g}, then {rounds} "
                       f"refinement rounds of {refine.epsilon[0]:g}", err=True)
        if secure is not None:
            trust = spec.assumptions
            typer.echo(f"secure aggregation: L = {trust.devices}, D = {trust.dropouts}, "
                       f"C = {trust.colluders}, h_min = {trust.min_honest}, "
                       f"t = {secure.threshold}", err=True)
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        study = stub.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), metadata=meta,
                                 timeout=30)
    if as_json:
        typer.echo(json.dumps({"study_id": study.study_id, "spec": json.loads(spec.to_json())}))
        return
    typer.echo(study.study_id)


@coordinator_app.command("tokens")
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


@coordinator_app.command("result")
def result(
    coordinator: Target,
    study: Annotated[str, typer.Argument(help="Study id.")],
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    strict: Annotated[bool, typer.Option(
        help=f"Exit with status {NOT_IDENTIFIABLE_EXIT} when the centroids cannot be told from the "
             "aggregate sketch's noise.")] = False,
) -> None:
    """The published centroids of a study, as JSON (as ``decode --json`` prints them), with
    "identifiability": whether they stand above the aggregate's noise, and why not (also on
    stderr); for a study with refinement rounds, "refined_rounds" says how many ended with new
    centres, and the identifiability is that of the sketch's start they refined. "noise_norm" is
    the norm the aggregate sketch's noise is expected to have (from the public spec and the
    released counts, sketch units), and stderr says how much of "residual" it explains. Results
    are not public: reading one takes the operator token (a device reads the results of the
    studies it contributed to with its own signature)."""
    from fedsketch.common.study import StudySpec

    with clean_errors():
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        res = stub.GetResult(pb.StudyRef(study_id=study), metadata=meta, timeout=30)
        spec = StudySpec.from_json(stub.ShowStudy(pb.StudyRef(study_id=study), metadata=meta,
                                                  timeout=30).spec_json)
    noise_norm = result_noise(spec, res.residual, res.devices, res.records)
    c = [list(res.centroids[i * res.d:(i + 1) * res.d]) for i in range(res.k)]
    verdict = {"status": res.status, "reason": res.status_reason, "z": list(res.z),
               "threshold": res.threshold}
    report_identifiability(res.status, res.status_reason, strict, lambda: typer.echo(json.dumps(
        {"centroids": c, "weights": list(res.weights), "residual": res.residual, "noise_norm": noise_norm,
         "devices": res.devices, "records": res.records, "identifiability": verdict,
         "refined_rounds": res.rounds})))


# The operator's view (list, status, audit, close) is a module of its own; importing it registers
# its commands on coordinator_app.
from fedsketch.server.cli import operator_view  # noqa: E402, F401
