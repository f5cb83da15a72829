"""How every ``fedsketch`` command reports an expected failure: one line on stderr, status 1."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import typer

from fedsketch.client.ledger import LedgerError

from .store import StoreError

#: Failures that mean bad input, an unusable file or state, or a missing optional package.
EXPECTED: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError, StoreError,
                                             LedgerError)


@contextmanager
def clean_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn an expected failure (:data:`EXPECTED`, plus ``extra``) into ``error: <first line>``
    on stderr and exit status 1; a refused gRPC call prints its status code and reason.
    Anything else propagates with its traceback (a bug, not bad input)."""
    try:
        yield
    except grpc.RpcError as exc:
        typer.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
        raise typer.Exit(1) from None
    except (*EXPECTED, *extra) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1) from None
