"""What every ``fedsketch`` command shares, device and coordinator side alike: one-line error
reporting, the options that name a coordinator and how to reach it, and the options that say
how to read a data file (``--header/--no-header``, ``--columns``: the same in every command).

Errors: an expected failure (bad input, an unusable file or state, a missing optional package, a
refused gRPC call) becomes ``error: <first line>`` on stderr and exit status 1; anything else
propagates with its traceback (a bug, not bad input). A failed connection to the coordinator is
said in words that name the option to check (:mod:`fedsketch.common.net.link`); the gRPC library's
own text follows only with the global ``--verbose``.

Nothing heavy is imported here (no numpy, no grpc): every command's ``--help`` needs this module.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .net.link import Link, describe
from .text import printable

if TYPE_CHECKING:
    import grpc

    from .data.dataio import DataSource
    from .sketch.dask_records import DaskRecords

#: Failures that mean bad input, an unusable file or state, or a missing optional package.
EXPECTED: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)

Target = Annotated[str, typer.Option("--coordinator", envvar="FEDSKETCH_COORDINATOR",
                                      help="Coordinator HOST:PORT; for coordinators sharing one "
                                      "database (serve --shared), IP:PORT,IP:PORT,...: calls go round "
                                      "robin, and under TLS every certificate must name the first "
                                      "address.")]
CaOpt = Annotated[Path | None, typer.Option("--ca", envvar="FEDSKETCH_CA",
                                            help="CA certificate (PEM) to trust: the ca.pem of the "
                                            "`certs init` that made the coordinator's certificate "
                                            "(default: the system's CAs).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON on stdout instead: what the command "
                                      "shows, as data (times as Unix seconds); notes stay on stderr.")]
InsecureOpt = Annotated[bool, typer.Option("--insecure", help="Plaintext gRPC (loopback demos "
                                           "only; explicit opt-out of TLS).")]


def header_option(envvar: str | None = None) -> typer.models.OptionInfo:
    """``--header/--no-header``: whether a CSV's first line holds column names (default: decided
    from the line, :mod:`fedsketch.common.data.csvio`)."""
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
#: ``--scale-range`` of every command that chooses σ (``sketch``, ``create-study``, ``simulate``).
ScaleRangeOpt = Annotated[str | None, typer.Option(
    help="σ search range LO:HI (data units) for --scale auto (default: h/60:5h/3, h the box's "
         "mean half-width, so the range follows the data's units).")]


def open_data(path: Path, header: bool | None, columns: str | None, *,
              allow_empty: bool = False, engine: str = "local",
              scheduler: str | None = None) -> DataSource | DaskRecords:
    """The data file at ``path`` read as the options say (or, with ``engine`` "dask", the folder
    of Parquet partitions summed on the Dask cluster at ``scheduler``:
    :class:`~fedsketch.common.sketch.dask_records.DaskRecords`); what the reader decided on its
    own (a header taken as such, pandas' index column left out) is printed on stderr as ``note:``."""
    from .data.dataio import DataSource, ReadOptions
    from .sketch.dask_records import open_records

    options = ReadOptions.parse(header, columns)
    source = open_records(path, engine, scheduler, options,
                          lambda: DataSource(path, allow_empty=allow_empty, options=options))
    for note in source.notes:
        typer.echo(f"note: {printable(str(path))}: {note}", err=True)
    return source


class _Run:
    """What the running command has said about itself: ``--verbose``, and the coordinator link
    it opened last (so a failed call on it is said in words)."""

    verbose = False
    link: Link | None = None


def stop_on_signals() -> threading.Event:
    """An Event set on SIGTERM or SIGINT, for a command's main loop to wait on.

    The handler only writes a byte to a pipe and a thread of its own reads it and sets the Event:
    a handler runs in the main thread between two bytecodes of whatever it was doing, and
    ``Event.set()`` there deadlocks when the main thread was inside the same Event's ``wait``
    holding its condition's lock (not reentrant). A device daemon polling with ``stop.wait`` hung
    so once, deaf to every later SIGTERM (tests/test_cli_signals.py reproduces it)."""
    stop = threading.Event()
    read_end, write_end = os.pipe()

    def watch() -> None:
        os.read(read_end, 1)
        stop.set()

    threading.Thread(target=watch, name="stop-signals", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os.write(write_end, b"s"))
    return stop


def set_verbose(verbose: bool) -> None:
    """The global ``--verbose``: errors keep the libraries' own text after the words."""
    _Run.verbose = verbose


def connect(target: str, ca: Path | None, insecure: bool) -> grpc.Channel:
    """A channel to the coordinator as the options (--coordinator, --ca, --insecure) say; a
    failed call on it is reported by :func:`clean_errors` in words that name the option."""
    _Run.link = Link(target, ca, insecure)
    return _Run.link.channel()


def rpc_words(exc: grpc.RpcError, link: Link | None = None) -> str:
    """A failed gRPC call in words (:func:`fedsketch.common.net.link.describe`) on ``link`` (default:
    the one :func:`connect` opened); with ``--verbose``, the library's text after them."""
    details = exc.details() or ""
    message = describe(exc.code().name, details, link or _Run.link)
    if _Run.verbose and details:
        message += f" [grpc: {printable(details)}]"
    return message


@contextmanager
def clean_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn an expected failure (:data:`EXPECTED`, plus ``extra``) into ``error: <first line>``
    on stderr and exit status 1; a refused gRPC call prints its status code and reason, and a
    failed connection what failed and which option to check."""
    try:
        yield
    except Exception as exc:
        rpc = sys.modules.get("grpc")  # a gRPC error can only come from an imported grpc
        if rpc is not None and isinstance(exc, rpc.RpcError):
            message = rpc_words(exc)
        elif isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
            message = f"{printable(str(exc.filename))}: {exc.strerror}"  # not "[Errno 2] ..."
        elif isinstance(exc, (*EXPECTED, *extra)):
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        else:
            raise
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(1) from None


def check_tls(ca: Path | None, insecure: bool) -> None:
    """Exactly one of --ca and --insecure, unless the system roots are meant (neither)."""
    if ca is not None and insecure:
        raise ValueError("--ca and --insecure exclude each other")
