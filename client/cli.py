"""``fedsketch device``: the device owner's commands (the daemon and its budget ledger).

The daemon also reads its options from ``FEDSKETCH_*`` environment variables (named in
``--help``), so a systemd unit can take them from an ``EnvironmentFile`` (see ``deploy/``); a
flag on the command line wins over the environment.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fedsketch.common.cli import CaOpt, InsecureOpt, Target, check_tls
from fedsketch.common.cli import clean_errors as _clean_errors

from . import daemon
from .ledger import Ledger, LedgerError, fingerprint_file

device_app = typer.Typer(no_args_is_help=True, help="Run a device daemon; read its ledger.")


def clean_errors():
    """:func:`fedsketch.common.cli.clean_errors`, with a ledger refusal among the expected."""
    return _clean_errors(LedgerError)


@device_app.command("run")
def device_run(
    coordinator: Target,
    data: Annotated[Path, typer.Option(envvar="FEDSKETCH_DATA",
                                       help="Local records (.npy or .csv).")],
    ledger: Annotated[Path, typer.Option(envvar="FEDSKETCH_LEDGER",
                                         help="Budget ledger (SQLite; created if missing).")],
    budget: Annotated[float, typer.Option(envvar="FEDSKETCH_BUDGET",
                                          help="Total ε this device may spend on DATA.")],
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    token: Annotated[str | None, typer.Option(envvar="FEDSKETCH_ENROLL_TOKEN",
                                              help="One-time enrollment token (first run).")]
    = None,
    label: Annotated[str, typer.Option(envvar="FEDSKETCH_LABEL", help="Name shown to operators.")] = "",
    once: Annotated[bool, typer.Option(help="One pass over the open studies, then exit.")] = False,
    poll: Annotated[float, typer.Option(envvar="FEDSKETCH_POLL", help="Base poll interval (s).")] = 2.0,
    max_poll: Annotated[float, typer.Option(envvar="FEDSKETCH_MAX_POLL",
                                            help="Longest poll interval (s).")] = 60.0,
) -> None:
    """Enroll once, then poll for studies; sketch, record the spend, sign and submit."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with clean_errors():
        check_tls(ca, insecure)
        if not (budget > 0 and math.isfinite(budget)):
            raise ValueError(f"--budget must be a finite ε > 0, got {budget}")
        cfg = daemon.DaemonConfig(coordinator, data, ledger, budget, ca, insecure, token, label,
                                  once, poll, max_poll)
        status = daemon.run(cfg, stop)
    raise typer.Exit(status)


@device_app.command("budget")
def device_budget(
    ledger: Annotated[Path, typer.Option(help="The device's ledger.")],
    data: Annotated[Path | None, typer.Option(help="Show what remains for this data file.")]
    = None,
    budget: Annotated[float, typer.Option(help="The budget the daemon runs with.")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout.")] = False,
) -> None:
    """Every spend in the ledger, and what remains for a data file."""
    with clean_errors():
        if not ledger.exists():
            raise ValueError(f"{ledger}: no such ledger")
        book = Ledger(ledger, budget)
        try:
            spends = book.spends()
            fp = fingerprint_file(data) if data is not None else None
            remaining = book.remaining(fp) if fp is not None else None
        finally:
            book.close()
    rows = [{"study": s.study_id, "epsilon": s.epsilon, "delta": s.delta, "n": s.n,
             "dataset": s.fingerprint[:12], "spent_at": s.spent_at,
             "acknowledged": s.acked_at is not None} for s in spends]
    if as_json:
        typer.echo(json.dumps({"spends": rows, "remaining": remaining}))
        return
    table = Table(title=f"ledger {ledger}")
    for col in ("study", "ε", "δ", "records", "dataset", "acknowledged"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["study"], f"{r['epsilon']:g}", f"{r['delta']:g}", f"{r['n']:,.0f}",
                      r["dataset"], "yes" if r["acknowledged"] else "not yet")
    Console().print(table)
    if remaining is not None:
        typer.echo(f"remaining for {data}: ε = {remaining:g} of {budget:g}")
