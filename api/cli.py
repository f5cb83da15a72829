"""The ``fedsketch`` command, assembled: its own options (``--version``, ``--verbose``) and the
command groups of the packages that define them — the commands on local files, ``simulate``,
``compare``, ``certs``, ``coordinator`` and ``helper`` from :mod:`fedsketch.server.cli`, and ``device`` from
:mod:`fedsketch.client.cli`. The installed ``fedsketch`` script is :data:`app`.

Nothing heavy is imported here: numpy, grpc and the mechanisms load inside the commands that use
them, so ``fedsketch --help`` starts at once (tests/test_cli_startup.py).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from fedsketch.client.cli import device_app
from fedsketch.common.cli import set_verbose
from fedsketch.common.helptext import TidyGroup
from fedsketch.server.cli.certs import certs_app
from fedsketch.server.cli.compare import compare_command
from fedsketch.server.cli.coordinator import coordinator_app
from fedsketch.server.cli.helper import helper_app
from fedsketch.server.cli.local import decode, evaluate, sketch, synth_app
from fedsketch.server.cli.simulate import simulate_command

app = typer.Typer(
    cls=TidyGroup,
    no_args_is_help=True,
    help="Federated, differentially private compressive k-means. Tab completion: "
         "--install-completion (bash, zsh, fish, PowerShell).",
)
app.add_typer(synth_app, name="synth")
app.add_typer(certs_app, name="certs")
app.add_typer(coordinator_app, name="coordinator")
app.add_typer(helper_app, name="helper")
app.add_typer(device_app, name="device")
app.command("simulate")(simulate_command)
app.command("compare")(compare_command)
app.command()(sketch)
app.command()(decode)
app.command()(evaluate)


def _print_version(value: bool) -> None:
    """``--version``: the installed package's version (pyproject.toml's), then exit."""
    if value:
        from importlib import metadata

        typer.echo(f"fedsketch {metadata.version('fedsketch')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", envvar="FEDSKETCH_VERBOSE",
        help="Errors also show the libraries' own text (gRPC's, the TLS library's), and gRPC "
             "logs its errors on stderr.")] = False,
) -> None:
    """The options of ``fedsketch`` itself (``--version``, ``--verbose``, typer's completion
    options)."""
    set_verbose(verbose)
    if not verbose:  # read once, when grpc loads (after this): no gRPC core log lines
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
