"""A device's signed read of studies or a result: the ``DeviceRead`` request of the Device
service's ``ListStudies``, ``GetStudy`` and ``GetResult``, signed by the device's enrolled key
over :func:`~fedsketch.common.signing.read_digest` (method, device, study, time). The coordinator
takes it within a few minutes of its own clock (``fedsketch.server.service.reads``, which also
says what a device may read)."""

from __future__ import annotations

import time

from fedsketch.common import signing
from fedsketch.common.pb import fedsketch_pb2 as pb


def signed_read(private_key: bytes, device_id: str, method: str, study_id: str = "",
                signed_at: float | None = None) -> pb.DeviceRead:
    """The ``DeviceRead`` of ``method`` ("ListStudies", "GetStudy" or "GetResult") for
    ``study_id`` ("" for ListStudies), signed now (or at ``signed_at``, Unix seconds) with the
    device's raw Ed25519 ``private_key``."""
    at = time.time() if signed_at is None else signed_at
    digest = signing.read_digest(method, device_id, study_id, at)
    return pb.DeviceRead(device_id=device_id, study_id=study_id, signed_at=at,
                         signature=signing.sign(private_key, digest))
