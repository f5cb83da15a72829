"""``fedsketch device``: the device owner's commands (the daemon, its budget and its policy).

The budget and the policy live in the ledger (:mod:`.ledger`, :mod:`.policy`): ``init`` sets
them once, ``add-source`` declares data holding other people, ``raise-budget`` is the one way up,
``policy`` changes what the device joins, and ``budget`` shows all of it with every spend.

The daemon also reads its options from ``FEDSKETCH_*`` environment variables (named in
``--help``), so a systemd unit can take them from an ``EnvironmentFile`` (see ``deploy/``); a
flag on the command line wins over the environment.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedsketch.client.ledger_records import LedgerError, check_budget
from fedsketch.client.ledger_schema import DEFAULT_SOURCE
from fedsketch.client.policy import Policy
from fedsketch.common.cli import (
    CaOpt,
    InsecureOpt,
    JsonOpt,
    Target,
    check_tls,
    columns_option,
    header_option,
    printable,
    stop_on_signals,
)
from fedsketch.common.cli import clean_errors as _clean_errors
from fedsketch.common.helptext import TidyGroup

if TYPE_CHECKING:  # the ledger (sqlite3, cryptography) and the daemon load in the commands
    from fedsketch.client.ledger import Ledger, Spend, Void

device_app = typer.Typer(cls=TidyGroup, no_args_is_help=True,
                         help="Run a device daemon; set and read its budget and policy.")

LedgerOpt = Annotated[Path, typer.Option(envvar="FEDSKETCH_LEDGER",
                                         help="The device's ledger (SQLite).")]
SourceOpt = Annotated[str, typer.Option(
    envvar="FEDSKETCH_SOURCE",
    help="Which declared data source the records belong to (its budget is charged).")]
DeltaOpt = Annotated[float | None, typer.Option(help="Total δ (0 ≤ δ < 1; default 0: pure ε only).")]
MaxEpsOpt = Annotated[float | None, typer.Option(help="Largest ε one study may take.")]
StudyOpt = Annotated[list[str] | None, typer.Option(
    "--study", help="Join only studies whose name matches this pattern (* and ?; repeatable).")]
CoordOpt = Annotated[list[str] | None, typer.Option(
    "--coordinator-pattern", help="Work only for coordinators HOST:PORT matching this pattern "
                                  "(repeatable).")]


def clean_errors():
    """:func:`fedsketch.common.cli.clean_errors`, with a ledger refusal among the expected."""
    return _clean_errors(LedgerError)


@contextmanager
def _existing(path: Path) -> Iterator[Ledger]:
    """An existing ledger, open for the block and closed after it."""
    if not path.exists():
        raise ValueError(f"{path}: no such ledger (create it with `fedsketch device init`)")
    from fedsketch.client.ledger import Ledger

    book = Ledger(path)
    try:
        yield book
    finally:
        book.close()


def _new_ledger_folder(path: Path) -> None:
    """Refuse a --ledger whose folder does not exist, naming the option (a ledger is created in
    an existing folder, never with one)."""
    if not path.parent.is_dir():
        raise ValueError(f"--ledger {path}: folder {path.parent} does not exist")


def _policy(base: Policy, max_epsilon: float | None, studies: list[str] | None,
            coordinators: list[str] | None) -> Policy:
    """``base`` with the options that were given."""
    return Policy(base.max_epsilon if max_epsilon is None else max_epsilon,
                  tuple(studies) if studies else base.studies,
                  tuple(coordinators) if coordinators else base.coordinators)


@device_app.command("init")
def device_init(
    ledger: LedgerOpt,
    budget: Annotated[float, typer.Option(help="Total ε the device may ever spend on SOURCE.")],
    budget_delta: DeltaOpt = None,
    source: SourceOpt = DEFAULT_SOURCE,
    max_epsilon: MaxEpsOpt = None,
    study: StudyOpt = None,
    coordinator_pattern: CoordOpt = None,
) -> None:
    """Create the ledger with the device's total budget and the owner's policy (once).

    The budget counts every study the device joins, whatever file the records come from. It
    can later be lowered (a smaller --budget to `run`) or raised (`raise-budget`, logged)."""
    with clean_errors():
        policy = _policy(Policy(), max_epsilon, study, coordinator_pattern)
        check_budget(budget, 0.0 if budget_delta is None else budget_delta)  # before any file
        _new_ledger_folder(ledger)
        from fedsketch.client.ledger import Ledger

        book = Ledger(ledger)
        try:
            book.declare(source, budget, 0.0 if budget_delta is None else budget_delta,
                         action="init")
            book.set_policy(policy)
        finally:
            book.close()
    typer.echo(f"{ledger}: source {source!r} may spend ε = {budget:g} in total")


@device_app.command("add-source")
def device_add_source(
    ledger: LedgerOpt,
    source: Annotated[str, typer.Argument(help="A name you choose for the new data source.")],
    budget: Annotated[float, typer.Option(help="Total ε of the new source.")],
    budget_delta: DeltaOpt = None,
) -> None:
    """Declare a data source whose records are about OTHER people than every declared source's.

    It gets its own budget (parallel composition). Declare one only when no person can appear in
    two sources: otherwise that person's privacy loss is the sum over both."""
    with clean_errors():
        with _existing(ledger) as book:
            book.declare(source, budget, 0.0 if budget_delta is None else budget_delta)
    typer.echo(f"{ledger}: source {source!r} may spend ε = {budget:g} in total")


@device_app.command("raise-budget")
def device_raise_budget(
    ledger: LedgerOpt,
    budget: Annotated[float, typer.Option(help="The new total ε (above the current one).")],
    reason: Annotated[str, typer.Option(help="Why; kept in the ledger's log.")],
    budget_delta: DeltaOpt = None,
    source: SourceOpt = DEFAULT_SOURCE,
) -> None:
    """Raise a source's total budget: the owner's explicit, logged decision that the people in the
    data accept a larger privacy loss. The daemon's --budget can never do this."""
    with clean_errors():
        with _existing(ledger) as book:
            old = book.budget(source)
            new = book.raise_budget(source, budget, budget_delta, reason)
    typer.echo(f"{ledger}: source {source!r}: ε {old.epsilon:g} → {new.epsilon:g}, "
               f"δ {old.delta:g} → {new.delta:g} (logged)")


@device_app.command("policy")
def device_policy(
    ledger: LedgerOpt,
    max_epsilon: MaxEpsOpt = None,
    study: StudyOpt = None,
    coordinator_pattern: CoordOpt = None,
) -> None:
    """Change what the device joins (options not given keep their value); print the policy."""
    with clean_errors():
        with _existing(ledger) as book:
            policy = _policy(book.policy(), max_epsilon, study, coordinator_pattern)
            book.set_policy(policy)
    typer.echo(policy.to_json())


@device_app.command("run")
def device_run(
    coordinator: Target,
    data: Annotated[Path, typer.Option(envvar="FEDSKETCH_DATA",
                                       help="Local records (.npy, .csv or .parquet).")],
    ledger: LedgerOpt,
    budget: Annotated[float | None, typer.Option(
        envvar="FEDSKETCH_BUDGET",
        help="Total ε of SOURCE: sets it on the first run; later it can only lower it.")] = None,
    budget_delta: Annotated[float | None, typer.Option(
        envvar="FEDSKETCH_BUDGET_DELTA",
        help="Total δ of SOURCE (first run: default 0); later it can only lower it.")] = None,
    source: SourceOpt = DEFAULT_SOURCE,
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    token: Annotated[str | None, typer.Option(envvar="FEDSKETCH_ENROLL_TOKEN",
                                              help="One-time enrollment token (first run).")]
    = None,
    label: Annotated[str, typer.Option(envvar="FEDSKETCH_LABEL", help="Name shown to operators.")] = "",
    once: Annotated[bool, typer.Option(help="One pass over the open studies, then exit.")] = False,
    poll: Annotated[float, typer.Option(envvar="FEDSKETCH_POLL", help="Base poll interval (s): "
                                              "the rate while the device waits in a roster or "
                                              "takes part in a secure round.")] = 2.0,
    max_poll: Annotated[float, typer.Option(envvar="FEDSKETCH_MAX_POLL",
                                            help="Longest poll interval (s).")] = 60.0,
    header: Annotated[bool | None, header_option("FEDSKETCH_HEADER")] = None,
    columns: Annotated[str | None, columns_option("FEDSKETCH_COLUMNS")] = None,
    engine: Annotated[str, typer.Option(
        envvar="FEDSKETCH_ENGINE",
        help="Where a study's feature sum is computed: local (this process) or dask (--data is a "
             "folder of Parquet files, each partition's exact integer sum computed on a Dask "
             "worker, added and noised once here; plain studies without refinement rounds "
             "only; the dask extra; docs/device-owners.md).")] = "local",
    scheduler: Annotated[str | None, typer.Option(
        envvar="FEDSKETCH_SCHEDULER",
        help="With --engine dask: the Dask scheduler's address (tls://HOST:8786: the workers "
             "send exact feature sums); default a local cluster of one worker per core.")] = None,
) -> None:
    """Enroll once, then poll for studies; sketch, record the spend, sign and submit. The
    device signs its reads of studies too (the coordinator shows each device only the studies
    it may join and the results of the studies it contributed to), and the coordinator takes
    them within 5 minutes of its own clock: keep this machine's clock set."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = stop_on_signals()
    from fedsketch.client import daemon
    from fedsketch.common.data.dataio import ReadOptions

    with clean_errors():
        check_tls(ca, insecure)
        _new_ledger_folder(ledger)
        cfg = daemon.DaemonConfig(coordinator, data, ledger, budget, budget_delta, source, ca,
                                  insecure, token, label, once, poll, max_poll,
                                  ReadOptions.parse(header, columns), engine, scheduler)
        status = daemon.run(cfg, stop)
    raise typer.Exit(status)


def _state(spend: Spend, void: Void | None = None) -> str:
    """What became of a spend, as far as the device knows (given back first, then a refusal of
    the bytes: the study may have ended without them)."""
    if void is not None:
        return f"void: ε given back ({void.reason})"
    if spend.receipt is not None and spend.receipt.startswith("refused: "):
        return f"refused by the coordinator ({spend.receipt.removeprefix('refused: ')})"
    if spend.final_state is not None:
        return spend.final_state
    if spend.acked_at is None:
        return "not sent yet"
    return "sent; study not ended"


def _shown(text: str | None) -> str:
    """``text`` safe for a rich table: :func:`~fedsketch.common.cli.printable`, markup escaped."""
    from rich.markup import escape

    return escape(printable(text))


def _when(t: float) -> str:
    """Local time of Unix seconds ``t``, or the number itself beyond the platform's range."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:g} (Unix s)"


def _verify(ledger: Path, coordinator: str | None, ca: Path | None, insecure: bool) -> None:
    """``device budget --verify`` (:mod:`.ledger_verify`): what holds on stdout, each problem on
    stderr, then one ``error:`` line and exit status 1 if there is any."""
    from fedsketch.client.ledger_verify import verify

    with clean_errors():
        with _existing(ledger) as book:
            holds, problems = verify(book, coordinator, ca, insecure)
    for line in holds:
        typer.echo(line)
    for line in problems:
        typer.echo(f"problem: {line}", err=True)
    if problems:
        typer.echo(f"error: the ledger {ledger} does not verify ({len(problems)} problems)", err=True)
        raise typer.Exit(1)


@device_app.command("budget")
def device_budget(
    ledger: LedgerOpt,
    as_json: JsonOpt = False,
    verify: Annotated[bool, typer.Option("--verify", help=(
        "Only check the spends against their seal (a hash chain signed with the device's key: "
        "a deleted, edited or added row is reported) and, with --coordinator, against what "
        "the coordinator counts against the budget the device declared; exit 1 if anything "
        "does not hold."))] = False,
    coordinator: Annotated[str | None, typer.Option(
        envvar="FEDSKETCH_COORDINATOR", help="With --verify: the coordinator HOST:PORT to compare "
        "with.")] = None,
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
) -> None:
    """The device's budgets (what each source may spend, has spent, has left, and how much of
    that is reserved or kept), its policy, the studies whose roster it joined and that reserve
    part of the budget, the studies whose later rounds keep part of it, every spend with its
    time, study and outcome, and the owner's log of budget changes."""
    if verify:
        _verify(ledger, coordinator, ca, insecure)
        return
    with clean_errors():
        with _existing(ledger) as book:
            budgets = book.sources()
            spent = {s: book.spent(s) for s in budgets}
            reserved = {s: book.reserved(s) for s in budgets}
            policy, spends, history = book.policy(), book.spends(), book.history()
            voids = book.voids()
            joined, promises = book.reservations(), book.promises()
    sources = {name: {"epsilon": b.epsilon, "delta": b.delta, "spent_epsilon": spent[name][0],
                      "spent_delta": spent[name][1],
                      "remaining_epsilon": max(0.0, b.epsilon - spent[name][0]),
                      "remaining_delta": max(0.0, b.delta - spent[name][1]),
                      "reserved_epsilon": reserved[name][0], "reserved_delta": reserved[name][1],
                      "kept_epsilon": math.fsum(p[3] for p in promises if p[2] == name),
                      "given_back_epsilon": math.fsum(s.epsilon for s in spends
                                                      if s.source == name and s.study_id in voids)}
               for name, b in budgets.items()}
    kept = [{"study_id": study, "release": name, "source": source, "epsilon": eps, "until": until}
            for study, name, source, eps, until in promises]
    held = [{"study_id": r.study_id, "study": r.study_name, "source": r.source,
             "epsilon": r.epsilon, "delta": r.delta, "joined_at": r.joined_at,
             "expires_at": r.expires_at} for r in joined]
    rows = [{"study_id": s.study_id, "study": s.study_name, "source": s.source,
             "epsilon": s.epsilon, "delta": s.delta, "n": s.n, "spent_at": s.spent_at,
             "state": _state(s, voids.get(s.study_id)), "parent": s.parent, "round": s.round,
             "void": None if (v := voids.get(s.study_id)) is None else
             {"reason": v.reason, "at": v.voided_at, "certificate": v.certificate is not None}}
            for s in spends]
    studies: dict[str, dict] = {}
    for s in spends:  # by round: "0" the study's own release (its sketch, or its round 0)
        study = studies.setdefault(s.parent or s.study_id, {"epsilon": 0.0, "rounds": {}})
        key = "sketch" if s.parent is not None and s.round == 0 else str(s.round)  # sketch round
        eps = 0.0 if s.study_id in voids else s.epsilon  # given back: it counts for nothing
        study["rounds"][key] = math.fsum((study["rounds"].get(key, 0.0), eps))
        study["epsilon"] = math.fsum(study["rounds"].values())
    log_rows = [{"at": h.at, "action": h.action, "source": h.source, "detail": h.detail}
                for h in history]
    if as_json:
        typer.echo(json.dumps({"sources": sources, "policy": json.loads(policy.to_json()),
                               "reserved": held, "kept": kept, "spends": rows, "studies": studies,
                               "history": log_rows}))
        return
    from rich.console import Console  # rich loads here: `device run` does not need it
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=escape(f"budget of {ledger}"))
    for col in ("source", "ε budget", "ε spent", "ε left", "δ budget", "δ spent"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, b in sources.items():
        left = f"{b['remaining_epsilon']:g}"
        aside = [f"{b[key]:g} of it {word}" for key, word in (("reserved_epsilon", "reserved"),
                                                               ("kept_epsilon", "kept")) if b[key] > 0]
        if aside:
            left += f" ({', '.join(aside)})"
        table.add_row(_shown(name), f"{b['epsilon']:g}", f"{b['spent_epsilon']:g}", left,
                      f"{b['delta']:g}", f"{b['spent_delta']:g}")
    console.print(table)
    console.print(f"policy: studies {', '.join(policy.studies)}; coordinators "
                  f"{', '.join(policy.coordinators)}; largest ε per study "
                  f"{'none' if policy.max_epsilon is None else f'{policy.max_epsilon:g}'}",
                  markup=False)
    held_table = Table(title="reserved (rosters joined, not full yet: nothing spent, the budget "
                             "set aside until the expiry)")
    for col in ("joined", "study", "source", "ε", "δ", "expires"):
        held_table.add_column(col)
    for r in held:
        held_table.add_row(_when(r["joined_at"]), _shown(f"{r['study']} ({r['study_id']})"),
                           _shown(r["source"]), f"{r['epsilon']:g}", f"{r['delta']:g}",
                           _when(r["expires_at"]))
    console.print(held_table)
    kept_table = Table(title="kept (the rounds still to come of studies the device took part in: "
                             "set aside until the study ends, at most until the time shown)")
    for col in ("study", "after the release", "source", "ε", "until"):
        kept_table.add_column(col)
    for k in kept:
        kept_table.add_row(_shown(k["study_id"]), _shown(k["release"]), _shown(k["source"]),
                           f"{k['epsilon']:g}", _when(k["until"]))
    console.print(kept_table)
    spent_table = Table(title="spends (round 0 is a study's sketch, 1.. its refinement rounds)")
    for col in ("when", "study", "round", "source", "ε", "ε of the study", "δ", "records", "outcome"):
        spent_table.add_column(col)
    for r in rows:
        spent_table.add_row(_when(r["spent_at"]), _shown(f"{r['study']} ({r['study_id']})"),
                            str(r["round"]), _shown(r["source"]), f"{r['epsilon']:g}",
                            f"{studies[r['parent'] or r['study_id']]['epsilon']:g}",
                            f"{r['delta']:g}", f"{r['n']:,.0f}", _shown(r["state"]))
    console.print(spent_table)
    log_table = Table(title="budget changes")
    for col in ("when", "action", "source", "detail"):
        log_table.add_column(col)
    for h in log_rows:
        log_table.add_row(_when(h["at"]), h["action"], _shown(h["source"]), _shown(h["detail"]))
    console.print(log_table)
