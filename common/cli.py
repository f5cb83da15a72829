"""What every ``fedsketch`` command shares, device and coordinator side alike: one-line error
reporting, the options that name a coordinator and how to reach it, and the options that say
how to read a data file (``--header/--no-header``, ``--columns``: the same in every command).

Errors: an expected failure (bad input, an unusable file or state, a missing optional package, a
refused gRPC call) becomes ``error: <first line>`` on stderr and exit status 1; anything else
propagates with its traceback (a bug, not bad input).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import grpc
import typer

from .dataio import DataSource, ReadOptions

#: Failures that mean bad input, an unusable file or state, or a missing optional package.
EXPECTED: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)

Target = Annotated[str, typer.Option("--coordinator", envvar="FEDSKETCH_COORDINATOR",
                                      help="Coordinator HOST:PORT.")]
CaOpt = Annotated[Path | None, typer.Option("--ca", envvar="FEDSKETCH_CA",
                                            help="CA certificate (PEM) to trust.")]
InsecureOpt = Annotated[bool, typer.Option("--insecure", help="Plaintext gRPC (loopback demos "
                                           "only; explicit opt-out of TLS).")]


def header_option(envvar: str | None = None) -> typer.models.OptionInfo:
    """``--header/--no-header``: whether a CSV's first line holds column names (default: decided
    from the line, :mod:`fedsketch.common.csvio`)."""
    return typer.Option(
        "--header/--no-header", envvar=envvar, show_default=False,
        help="CSV only: the first line holds column names (--header) or is a record (--no-header) "
             "(default: a header if a field is not a number, or if the fields are exactly "
             "0,1,…,d−1 as pandas writes them).")


def columns_option(envvar: str | None = None) -> typer.models.OptionInfo:
    """``--columns a,b,c``: the columns to read, by name (a CSV with a header, or Parquet)."""
    return typer.Option(
        "--columns", envvar=envvar, metavar="A,B,…",
        help="Read only these columns, by name and in this order (a CSV with a header, or a "
             "Parquet file; default: every column, pandas' index column left out).")


HeaderOpt = Annotated[bool | None, header_option()]
ColumnsOpt = Annotated[str | None, columns_option()]


def open_data(path: Path, header: bool | None, columns: str | None, *,
              allow_empty: bool = False) -> DataSource:
    """The data file at ``path`` read as the options say; what the reader decided on its own (a
    header taken as such, pandas' index column left out) is printed on stderr as ``note:``."""
    source = DataSource(path, allow_empty=allow_empty, options=ReadOptions.parse(header, columns))
    for note in source.notes:
        typer.echo(f"note: {printable(str(path))}: {note}", err=True)
    return source


def printable(text: str | None) -> str:
    """``text`` (None as "") safe for a terminal or a log line: each control character (a hostile
    coordinator's study name or id could carry escape sequences) as its Python escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text or "")


@contextmanager
def clean_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn an expected failure (:data:`EXPECTED`, plus ``extra``) into ``error: <first line>``
    on stderr and exit status 1; a refused gRPC call prints its status code and reason."""
    try:
        yield
    except grpc.RpcError as exc:
        typer.echo(f"error: {exc.code().name}: {printable(exc.details())}", err=True)
        raise typer.Exit(1) from None
    except (*EXPECTED, *extra) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1) from None


def check_tls(ca: Path | None, insecure: bool) -> None:
    """Exactly one of --ca and --insecure, unless the system roots are meant (neither)."""
    if ca is not None and insecure:
        raise ValueError("--ca and --insecure exclude each other")
