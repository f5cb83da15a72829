"""The signed messages devices send, as the coordinator's logic receives them from the gRPC edge
(:mod:`.api`), free of protobuf types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Submission:
    """One signed contribution as a device sent it; ``kind`` is None when it carried no payload."""

    study_id: str
    device_id: str
    n: float
    spec_sha256: str
    kind: str | None
    payload: bytes
    signature: bytes


@dataclass(frozen=True)
class RegistrationMessage:
    """One signed registration for a plain study's roster (or a leave of it); ``ticket``: the
    registration asks for an input ticket (the wire's ``not join_only``)."""

    study_id: str
    device_id: str
    spec_sha256: str
    signature: bytes
    ticket: bool = False


@dataclass(frozen=True)
class StageMessage:
    """One signed secure-aggregation stage message (a fetch is signed the same way)."""

    study_id: str
    device_id: str
    stage: int
    body: bytes
    signature: bytes


@dataclass(frozen=True)
class RefusalMessage:
    """One signed refusal report: the device declined the study for ``reason`` (one of
    :data:`~fedsketch.server.store.base.REFUSAL_REASONS`), whose ``code`` (the proto's
    ``RefusalReason`` number) is what the signature covers."""

    study_id: str
    device_id: str
    spec_sha256: str
    reason: str
    code: int
    signature: bytes


@dataclass(frozen=True)
class ReadMessage:
    """One device's signed read (``DeviceRead``) of the Device service's ``method``
    ("ListStudies", "GetStudy" or "GetResult"); ``study_id`` "" for a list, ``signed_at`` Unix
    seconds, ``audience`` the coordinator it is signed for and ``format`` its digest's format
    (0 from a device that predates formats)."""

    method: str
    device_id: str
    study_id: str
    signed_at: float
    signature: bytes
    audience: str
    format: int
