"""``fedsketch`` commands run in the test's process (the installed script's ``app``, through
typer's CliRunner): the same command, its output and exit status, without the start of a process,
which costs about 0.5 CPU s (imports) per call. For the commands a test reads or that change a
store or ledger through the command's code; a process whose own life a test is about (a daemon,
a fault point that kills it, ``coordinator serve``) stays a process."""

from __future__ import annotations

import os

from click.testing import Result
from test_round_processes import CoordinatorProcess
from typer.testing import CliRunner

from fedsketch.cli import app


def here(*args: str, check: bool = True) -> Result:
    """``fedsketch ARGS``; with ``check``, AssertionError (with its output) unless it exits 0.
    The command's own setting of ``GRPC_VERBOSITY`` (the app's callback, meant for its process)
    is undone afterwards, so the processes this one starts later inherit the environment as
    before."""
    res = CliRunner().invoke(app, list(args), env={"GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY")})
    if check:
        assert res.exit_code == 0, (res.output, res.exception)
    return res


def op_here(c: CoordinatorProcess, command: str, *args: str, check: bool = True) -> Result:
    """The operator's ``fedsketch coordinator COMMAND ARGS`` against ``c``, as
    :meth:`CoordinatorProcess.op` runs it in a process."""
    return here("coordinator", command, "--coordinator", c.target, "--ca", str(c.certs / "ca.pem"),
                "--token-file", str(c.token_file), *args, check=check)
