"""``fedsketch helper serve``: the helper of secure studies validated by two aggregators
(:mod:`fedsketch.server.helper`, docs/bounded-influence.md). Run by a party other than the
coordinator's operator: the devices' inputs stay private unless the two collude.

Its options, like the coordinator's, are also read from ``FEDSKETCH_HELPER_*`` environment
variables; errors are one ``error:`` line and exit status 1.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.cli import InsecureOpt, stop_on_signals
from fedsketch.common.helptext import TidyGroup
from fedsketch.server.cli.errors import clean_errors
from fedsketch.server.cli.operator_link import read_token


def serve(
    db: Annotated[Path, typer.Option(envvar="FEDSKETCH_HELPER_DB", help="The helper's SQLite "
                                     "file (created if missing): every share it acknowledged.")],
    listen: Annotated[str, typer.Option(envvar="FEDSKETCH_HELPER_LISTEN",
                                        help="HOST:PORT to listen on.")] = "127.0.0.1:7444",
    cert: Annotated[Path | None, typer.Option(envvar="FEDSKETCH_HELPER_CERT",
                                              help="The helper's own server certificate (PEM; "
                                              "`fedsketch certs init` makes one).")] = None,
    key: Annotated[Path | None, typer.Option(envvar="FEDSKETCH_HELPER_KEY",
                                             help="Its private key (PEM).")] = None,
    insecure: InsecureOpt = False,
    token_file: Annotated[Path, typer.Option(
        "--token-file", envvar="FEDSKETCH_HELPER_TOKEN_FILE",
        help="The token the coordinator must show (created, mode 0600, with a fresh token if "
             "missing); give a copy to the coordinator's operator.")] = Path("helper.token"),
    min_reports: Annotated[int, typer.Option(
        min=2, envvar="FEDSKETCH_HELPER_MIN_REPORTS",
        help="Never answer a share of a sum over fewer valid reports than this (nor than the "
             "study's own minimum).")] = 3,
    port_file: Annotated[Path | None, typer.Option(help="Write the bound port here once "
                                                   "serving (for port 0).")] = None,
) -> None:
    """Serve the Helper gRPC service until SIGTERM or SIGINT: devices upload their helper shares
    of a validated secure study; the coordinator (with the helper token) closes a study's
    collection, asks for the helper's verifier messages and, once, for its share of the sum
    over the reports both found valid."""
    from fedsketch.common.net.tls import server_tls
    from fedsketch.server.helper.service import build_helper
    from fedsketch.server.helper.store import HelperStore, HelperStoreError
    from fedsketch.server.store.filelock import hold_exclusive

    log = logging.getLogger("fedsketch.helper")
    with clean_errors(HelperStoreError):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        if insecure == (cert is not None or key is not None):
            raise ValueError("give --cert and --key for TLS, or --insecure (not both)")
        if not insecure and (cert is None or key is None):
            raise ValueError("TLS needs both --cert and --key")
        tls = None if insecure else server_tls(cert, key)
        for option, path in (("--db", db), ("--token-file", token_file)):
            if not path.parent.is_dir():
                raise ValueError(f"{option} {path}: folder {path.parent} does not exist")
        hold_exclusive(str(db))
        store = HelperStore(str(db))
        if not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32) + "\n")
            log.info("wrote a new helper token to %s", token_file)
        token_sha256 = hashlib.sha256(read_token(token_file).encode()).hexdigest()
        server, port = build_helper(store, token_sha256, listen, tls, min_reports)
    stop = stop_on_signals()
    if port_file is not None:
        port_file.write_text(f"{port}\n")
    log.info("helper serving on port %d (%s)", port, "plaintext" if insecure else "TLS")
    stop.wait()
    server.stop(grace=5).wait()
    store.shut()


helper_app = typer.Typer(cls=TidyGroup, no_args_is_help=True,
                         help="Run the helper of secure studies validated by two aggregators.")
helper_app.command("serve")(serve)
