"""A device's signed read of studies or a result: the ``DeviceRead`` request of the Device
service's ``ListStudies``, ``GetStudy`` and ``GetResult``, signed by the device's enrolled key
over :func:`~fedsketch.common.net.signing.read_digest` (coordinator, method, device, study, time).
The coordinator takes it within a few minutes of its own clock (``fedsketch.server.service.reads``,
which also says what a device may read).

The audience: a read names the coordinator it is meant for, as the device verified it over TLS:
the host of ``--coordinator`` (of its first address for a list, the name gRPC verifies the
certificate against; :mod:`fedsketch.common.net.link`). The coordinator takes only a read whose
audience its own certificate names, so a read a device sent to one coordinator is refused by
another, whose certificate does not name the first (a coordinator that captured it cannot replay
it elsewhere). Coordinators serving one database (``--shared``) behind a list all present a
certificate naming the list's first address, so one read is good at each of them, whichever
the call reached. The certificate's name, rather than its fingerprint: the device verifies the
name (gRPC shows it no fingerprint), and the name outlives a certificate's renewal. A name is
compared in one form (:func:`audience_name`): an IP address as Python's ``ipaddress`` writes it
(IPv6 compressed, no brackets), a DNS name in lower case without a trailing dot; a certificate's
wildcard name ``*.example.org`` covers one label, as in TLS (``coord.example.org``).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Collection

from fedsketch.common.net import signing
from fedsketch.common.net.link import first_host
from fedsketch.common.pb import fedsketch_pb2 as pb


def audience_name(host: str) -> str:
    """``host`` (a DNS name or an IP address, IPv6 with or without brackets) in the one form
    audiences are compared in (module docstring)."""
    bare = host.strip().removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare.lower().rstrip(".")


def audience(coordinator: str) -> str:
    """The audience of a read sent to ``coordinator`` (``--coordinator``: HOST:PORT, or a list
    of IP:PORT): its first address's host, in :func:`audience_name`'s form."""
    return audience_name(first_host(coordinator))


def names_audience(names: Collection[str], read_audience: str) -> bool:
    """Whether a certificate naming ``names`` (each in :func:`audience_name`'s form) names the
    audience ``read_audience``: one of them equals it, or a wildcard ``*.rest`` one covers it
    (``read_audience`` is ``label.rest``, its first label not empty). An audience holding a
    ``*`` is no host a device connects to, and none is named."""
    if "*" in read_audience:
        return False
    label, _, rest = read_audience.partition(".")
    return read_audience in names or (bool(label) and bool(rest) and f"*.{rest}" in names)


def signed_read(private_key: bytes, device_id: str, coordinator: str, method: str,
                study_id: str = "", signed_at: float | None = None) -> pb.DeviceRead:
    """The ``DeviceRead`` of ``method`` ("ListStudies", "GetStudy" or "GetResult") for
    ``study_id`` ("" for ListStudies), sent to ``coordinator`` (``--coordinator``, whose
    :func:`audience` it is signed for), signed now (or at ``signed_at``, Unix seconds) with the
    device's raw Ed25519 ``private_key``."""
    at = time.time() if signed_at is None else signed_at
    to = audience(coordinator)
    digest = signing.read_digest(to, method, device_id, study_id, at)
    return pb.DeviceRead(device_id=device_id, study_id=study_id, signed_at=at, audience=to,
                         format=signing.READ_FORMAT, signature=signing.sign(private_key, digest))
