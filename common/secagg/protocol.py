"""The vocabulary of secure aggregation: its stages, its messages and its aborts.

The protocol itself is described in :mod:`fedsketch.common.secagg`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import wraps
from typing import Any, NoReturn, TypeVar

#: Domain-separation prefix of every hash, key derivation and AEAD context of the protocol.
DOMAIN_PREFIX = b"fedsketch/secagg/v1/"
KIND_B = "b"  # share of a survivor's self-mask seed
KIND_SK = "s_sk"  # share of a dropped device's masking private key


class Stage(Enum):
    """The five stages of the protocol, in order (package docstring, 1–5); values are their names.

    The one definition of the stages: a study's wire stages (REGISTER, then these) and their pb
    values are :data:`fedsketch.common.secagg.wire.STAGES`, and the simulator's dropout stages are
    the values.
    """

    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"


class SecAggAbort(Exception):
    """The protocol cannot continue safely; ``reason`` says why. Nothing further is revealed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fail(reason: str) -> NoReturn:
    """Raise :class:`SecAggAbort` with ``reason``."""
    raise SecAggAbort(reason)


_Method = TypeVar("_Method", bound=Callable)


def final_on_abort(method: _Method) -> _Method:
    """Make a SecAggAbort raised by a stage final: the party refuses every later stage."""

    @wraps(method)
    def stage(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._aborted is not None:
            raise SecAggAbort(f"already aborted: {self._aborted}")
        try:
            return method(self, *args, **kwargs)
        except SecAggAbort as exc:
            self._aborted = exc.reason
            raise

    return stage  # type: ignore[return-value]


@dataclass(frozen=True)
class Advert:
    """Stage 1 message: u's X25519 public keys (raw 32 bytes each) and its Ed25519 signature."""

    device_id: str
    c_pk: bytes
    s_pk: bytes
    signature: bytes


@dataclass(frozen=True)
class SignedSurvivors:
    """Stage 5 request to every signer: the survivor list Y (sorted ids) and the signatures on
    it that the coordinator collected at stage 4 (signer → 64-byte Ed25519 signature over
    :func:`~.crypto.survivors_digest`)."""

    survivors: tuple[str, ...]
    signatures: dict[str, bytes]
