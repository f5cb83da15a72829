"""The coordinator's refusals in its own terms: a :class:`Code` and a one-line reason.

The service (:mod:`fedsketch.server.service`) and the store (:mod:`fedsketch.server.store`) raise
them; only the gRPC edge (:mod:`fedsketch.server.service.api`) turns a code into a status, so
neither depends on the transport.
"""

from __future__ import annotations

from enum import Enum


class Code(str, Enum):
    """Why a request is refused, in the coordinator's terms (a ``str`` so ``code == "conflict"``
    reads naturally in tests and logs); the gRPC layer maps each one to one status code."""

    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # the thing exists with different content
    FAILED_PRECONDITION = "failed_precondition"  # valid request, wrong moment (state, stage)
    INVALID_ARGUMENT = "invalid_argument"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    ABORTED = "aborted"  # valid request that conflicts with a promise in force: retry later


class Refusal(Exception):
    """A request refused with a :class:`Code` and a one-line reason (``str(exc)``) for the client.

    A refusal changes nothing: it is raised before any write, or its transaction is rolled back.
    """

    def __init__(self, code: Code | str, message: str) -> None:
        try:
            code = Code(code)
        except ValueError:
            raise ValueError(f"unknown refusal code {code!r}") from None
        super().__init__(message)
        self.code = code
        self.message = message
