"""What the operator's commands share: the ``--token-file`` option, reading the operator token,
the Operator stub that sends it, and the names of a study's states."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.cli import connect
from fedsketch.common.pb import fedsketch_pb2 as pb

TokenFile = Annotated[Path, typer.Option("--token-file", envvar="FEDSKETCH_OPERATOR_TOKEN_FILE",
                                         help="File holding the operator token: the one `coordinator "
                                         "serve` wrote (its --token-file, by default operator.token "
                                         "in the folder it runs in).")]
STATE_NAMES = {v: k for k, v in pb.StudyState.items()}


def read_token(path: Path) -> str:
    """The operator token stored in ``path`` (one line); a missing, unreadable or empty file is
    refused naming --token-file and where ``serve`` writes it."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"--token-file {path}: cannot read the operator token "
                         f"({exc.strerror or exc}); `coordinator serve` writes it to its own "
                         "--token-file (default operator.token in the folder it runs in): give "
                         "that file's path") from None
    if not token:
        raise ValueError(f"--token-file {path}: empty operator token file")
    return token


def operator_stub(target: str, ca: Path | None, insecure: bool, token_file: Path):
    """(Operator stub, call metadata) for admin calls."""
    from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc

    meta = (("authorization", f"Bearer {read_token(token_file)}"),)
    return pb_grpc.OperatorStub(connect(target, ca, insecure)), meta
