"""The command line's link to a coordinator: the channel the options (``--coordinator``, ``--ca``,
``--insecure``) describe, and what a failure on it means, in words that name the option to check.

``--coordinator`` names one coordinator (HOST:PORT) or several that serve one database
(``coordinator serve --shared``): a comma-separated list of IP:PORT, whose calls gRPC's
``round_robin`` policy spreads over the addresses (each call to the next ready one), verified
under TLS against the list's first address, which every coordinator's certificate must
therefore name (one certificate naming every address, as ``certs init --host IP1 --host IP2``
makes, does). A DNS name with several records keeps gRPC's default ``pick_first``: one address
at a time, the next when it fails (so a name that resolves to a closed ::1 beside a live
127.0.0.1 still reports the live one's TLS error, not a refused connection).

gRPC reports a failed connection as UNAVAILABLE with the TLS library's text (BoringSSL's error
stack, ending in ": OK"). :func:`describe` recognizes the usual causes in that text:

- the coordinator's certificate is not signed by the CA given (``--ca``), or by the system's;
- the certificate does not name the host in ``--coordinator`` (``certs init --host``);
- TLS against a plaintext coordinator, or plaintext (``--insecure``) against a TLS one;
- nothing listens at HOST:PORT, or the host name does not resolve.

Any other status is the coordinator's own refusal, whose reason is already words: it is shown
as ``STATUS: reason``, control characters escaped (a refused operator token adds which option
to check).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc


@dataclass(frozen=True)
class Link:
    """How the command reaches the coordinator: ``target`` HOST:PORT, the CA file it trusts
    (None: the system's CAs) and whether it speaks plaintext."""

    target: str
    ca: Path | None
    insecure: bool

    def channel(self) -> grpc.Channel:
        """The gRPC channel (:func:`fedsketch.common.net.tls.secure_channel`); a CA file that cannot
        be read or is not PEM is refused here, naming ``--ca``."""
        from .tls import secure_channel

        if self.ca is not None and self.insecure:
            raise ValueError("--ca and --insecure exclude each other")
        target, authority = grpc_target(self.target)
        options = [] if authority is None else [("grpc.lb_policy_name", "round_robin"),
                                                ("grpc.default_authority", authority)]
        try:
            return secure_channel(target, self.ca, insecure=self.insecure, options=options)
        except ValueError as exc:
            raise ValueError(f"--ca {exc}") from None

    @property
    def host(self) -> str:
        """The host part of ``target``'s first address (:func:`first_host`)."""
        return first_host(self.target)


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


def describe(code: str, details: str, link: Link | None) -> str:
    """One line for a failed gRPC call with status ``code`` (a name such as "UNAVAILABLE") and
    the library's ``details``: what failed and which option to check, for a failed connection;
    ``code: details`` (control characters escaped) for a refusal by the coordinator."""
    from ..cli import printable

    where = f"the coordinator at {link.target}" if link else "the coordinator"
    if code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        hint = (" (check --token-file: it must hold the token `coordinator serve` wrote to its "
                "--token-file)" if "operator credential" in details else "")
        return f"{code}: {printable(details)}{hint}"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        if link is not None and link.ca is not None:
            return (f"{where} has a certificate that is not signed by the CA in --ca {link.ca} "
                    "(give the ca.pem of the `certs init` that made its certificate)")
        return (f"{where} has a certificate that no CA of this system signed (give its CA with "
                "--ca, the ca.pem of `certs init`)")
    if "Hostname Verification" in details or "Peer name" in details:
        host = link.host if link else "the host in --coordinator"
        return (f"the coordinator's certificate does not name {host} (use the host name or IP in "
                "--coordinator that `certs init --host` named)")
    if "WRONG_VERSION_NUMBER" in details:
        return (f"{where} does not speak TLS (if it serves with --insecure, a loopback demo, "
                "connect with --insecure)")
    if link is not None and link.insecure and ("Socket closed" in details
                                               or "Connection reset" in details):
        return (f"{where} closed the plaintext connection: it serves TLS (drop --insecure and "
                "give its CA with --ca)")
    if "handshake" in details.lower():
        return f"the TLS handshake with {where} failed (check --ca, and --cert/--key of its serve)"
    target = link.target if link else "--coordinator"
    if "Connection refused" in details:
        return (f"cannot reach the coordinator at {target}: connection refused (is it running, "
                "and is --coordinator its HOST:PORT?)")
    if "resolving" in details or "lookup" in details or "DNS" in details:
        return (f"cannot reach the coordinator at {target}: the host name does not resolve "
                "(check --coordinator)")
    if code == "DEADLINE_EXCEEDED":
        return f"the coordinator at {target} did not answer in time"
    return f"cannot reach the coordinator at {target} (check --coordinator, and that it is running)"
