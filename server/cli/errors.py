"""How the coordinator-side commands report an expected failure: :func:`fedsketch.common.cli.clean_errors`
with the store's refusals among the expected ones (the simulator adds its devices' ledger
refusals), and the verdict on published centroids (:func:`report_verdict`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import typer

from fedsketch.common.cli import clean_errors as _clean_errors


def clean_errors(*extra: type[BaseException]) -> AbstractContextManager[None]:
    """``error: <first line>`` and exit status 1 for bad input, a store refusal, a refused gRPC
    call, and ``extra``."""
    from fedsketch.server.store.base import StoreError  # here: the store loads only when used

    return _clean_errors(StoreError, *extra)


#: Exit status of ``decode --strict``, ``coordinator result --strict`` and ``simulate --strict``
#: for centroids whose verdict is "unreliable" (:mod:`fedsketch.common.study.verdict`).
NOT_IDENTIFIABLE_EXIT = 3


def report_verdict(verdict: dict | None, strict: bool, show: Callable[[], None]) -> None:
    """Print a result with ``show()``, then, unless its ``verdict`` (a
    :meth:`~fedsketch.common.study.verdict.Verdict.to_dict`) is "good", say why on stderr: a
    warning, or for "unreliable" with ``strict`` an error and exit status NOT_IDENTIFIABLE_EXIT.
    None (a result published before the verdict existed) says that it was not judged."""
    from fedsketch.common.study.verdict import GOOD, UNRELIABLE

    show()
    if not verdict:
        typer.echo("note: this result predates the quality verdict; it was not judged", err=True)
        return
    if verdict["status"] == GOOD:
        return
    fail = strict and verdict["status"] == UNRELIABLE
    typer.echo(f"{'error' if fail else 'warning'}: {verdict['status']}: {verdict['reason']}", err=True)
    if fail:
        raise typer.Exit(NOT_IDENTIFIABLE_EXIT)
