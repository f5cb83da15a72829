"""A coordinator's address as ``--coordinator`` gives it: one HOST:PORT, or a comma-separated
list of IP:PORT of coordinators serving one database (``coordinator serve --shared``); the host
TLS verifies (the first address's) and the target gRPC dials (:mod:`fedsketch.common.net.link`
says how a list is balanced). Pure string work: no gRPC, no TLS."""

from __future__ import annotations

import ipaddress


def first_host(target: str) -> str:
    """The host part of ``--coordinator``'s first address (brackets of an IPv6 literal removed):
    the name TLS verifies the coordinator's certificate against (:func:`grpc_target`)."""
    first = target.split(",")[0].strip()
    host = first.rpartition(":")[0] or first
    return host.removeprefix("[").removesuffix("]")


def grpc_target(target: str) -> tuple[str, str | None]:
    """gRPC's target for ``--coordinator`` and the TLS name to verify, None for the target's own.

    One address passes as it is (a DNS name's records are all used). A comma-separated list of
    IP:PORT becomes ``ipv4:IP:PORT,…`` (or ``ipv6:[IP]:PORT,…``), verified against its first IP;
    ValueError names the entry that is not an IP:PORT of the list's one family."""
    entries = [entry.strip() for entry in target.split(",")]
    if len(entries) == 1:
        return target, None
    families = set()
    for entry in entries:
        host, _, port = entry.rpartition(":")
        try:
            ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
            if not 0 < int(port) < 65536 or (ip.version == 6) != host.startswith("["):
                raise ValueError
        except ValueError:
            raise ValueError(f"--coordinator {target!r}: {entry!r} is not IP:PORT ([IP]:PORT for IPv6); a "
                             "list of coordinators takes IP addresses, and host names go in one DNS "
                             "name whose records list every coordinator") from None
        families.add(ip.version)
    if len(families) > 1:
        raise ValueError(f"--coordinator {target!r} mixes IPv4 and IPv6 addresses; list one family")
    first = entries[0].rpartition(":")[0]
    return f"ipv{families.pop()}:{','.join(entries)}", first
