"""How the coordinator-side commands report an expected failure: :func:`fedsketch.common.cli.clean_errors`
with the store's refusals among the expected ones (the simulator adds its devices' ledger
refusals), and a decoding whose centroids cannot be told from noise (:func:`report_identifiability`)."""

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


#: Exit status of ``decode --strict`` and ``coordinator result --strict`` for centroids that cannot
#: be told from the sketch's noise.
NOT_IDENTIFIABLE_EXIT = 3


def report_identifiability(status: str, reason: str, strict: bool, show: Callable[[], None]) -> None:
    """Print a decoding with ``show()``, then, when ``status`` is not "identified", say why on
    stderr: a warning, or with ``strict`` an error and exit status NOT_IDENTIFIABLE_EXIT. An empty
    status (a result published before the check existed) says that it was not checked."""
    from fedsketch.server.decode.identify import IDENTIFIED

    show()
    if status == IDENTIFIED:
        return
    if not status:
        typer.echo("note: this result predates the noise check; it was not judged against the "
                   "sketch's noise", err=True)
        return
    typer.echo(f"{'error' if strict else 'warning'}: {status}: {reason}", err=True)
    if strict:
        raise typer.Exit(NOT_IDENTIFIABLE_EXIT)
