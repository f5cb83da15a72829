"""``fedsketch certs``: the TLS certificates of a coordinator (a private CA and a server
certificate signed by it, :func:`fedsketch.common.net.tls.init_certs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.cli import JsonOpt
from fedsketch.server.cli.errors import clean_errors

certs_app = typer.Typer(no_args_is_help=True, help="TLS certificates for a coordinator.")


@certs_app.command("init")
def certs_init(
    out: Annotated[Path, typer.Option(help="Folder for ca.pem, ca.key, server.pem, server.key.")],
    host: Annotated[list[str], typer.Option(help="Host name or IP of the coordinator "
                                            "(repeatable).")],
    days: Annotated[int, typer.Option(help="Validity in days.")] = 825,
    as_json: JsonOpt = False,
) -> None:
    """Create a private CA and a server certificate for the coordinator's host names."""
    from fedsketch.common.net.tls import init_certs

    with clean_errors():
        paths = init_certs(out, host, days)
    if as_json:
        typer.echo(json.dumps({"ca_cert": str(paths.ca_cert), "ca_key": str(paths.ca_key),
                               "server_cert": str(paths.server_cert),
                               "server_key": str(paths.server_key), "hosts": host, "days": days}))
        return
    typer.echo(f"CA {paths.ca_cert} (give it to devices with --ca); server certificate "
               f"{paths.server_cert} and key {paths.server_key} (give them to "
               "`coordinator serve`)")
