"""TLS for the gRPC link between devices and the coordinator: a private CA and the credentials.

:func:`init_certs` creates a private certificate authority and a server certificate signed by it
(ECDSA P-256, PEM files). The coordinator serves with :func:`server_credentials`; devices connect
with :func:`secure_channel`, trusting only that CA (or the system roots when no CA is given).
Plaintext is an explicit opt-out (``insecure=True``), never a fallback.

Every channel made here caps messages at :data:`MAX_MESSAGE_BYTES` in both directions.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import astuple, dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..atomicfile import atomic_write
from .device_reads import audience_name

MAX_MESSAGE_BYTES = 4 * 1024 * 1024

_CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class CertPaths:
    """Where :func:`init_certs` wrote the CA certificate and key and the server certificate and key."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def init_certs(out_dir: Path, hosts: list[str], days: int = 825) -> CertPaths:
    """Create a private CA and a server certificate for ``hosts``; write them as PEM into ``out_dir``.

    The CA is a self-signed ECDSA P-256 certificate (basic constraints CA=true, critical; key usage
    keyCertSign and cRLSign). The server certificate is signed by it, names every host in its
    subject alternative names (an IP address entry for IP literals such as ``127.0.0.1`` or ``::1``,
    a DNS name entry otherwise), is for serverAuth only and is not a CA. Both are valid from five
    minutes ago (clock skew) for ``days`` days.

    Files: ``ca.pem``, ``ca.key``, ``server.pem``, ``server.key``. ``out_dir`` is created if needed.
    Each file is written to a temporary sibling and renamed into place; key files have mode 0600,
    certificates 0644. If a write fails, the files this call already wrote are removed.

    Raises FileExistsError, before writing anything, if any of the four files exists; ValueError if
    ``hosts`` is empty or holds an empty name, or ``days`` is not positive.
    """
    names = _parse_hosts(hosts)
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    out_dir = Path(out_dir)
    paths = CertPaths(out_dir / "ca.pem", out_dir / "ca.key", out_dir / "server.pem", out_dir / "server.key")
    existing = [str(p) for p in astuple(paths) if p.exists()]
    if existing:
        raise FileExistsError(f"refusing to overwrite existing TLS files: {', '.join(existing)}")

    now = dt.datetime.now(dt.timezone.utc)
    not_before, not_after = now - _CLOCK_SKEW, now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsketch private CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsketch coordinator")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    contents = [
        (paths.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644),
        (paths.ca_key, _key_pem(ca_key), 0o600),
        (paths.server_cert, server_cert.public_bytes(serialization.Encoding.PEM), 0o644),
        (paths.server_key, _key_pem(server_key), 0o600),
    ]
    written: list[Path] = []
    try:
        for path, data, mode in contents:
            with atomic_write(path, mode) as fh:
                fh.write(data)
            written.append(path)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return paths


def server_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    """Server TLS credentials from a PEM certificate (chain) and its PEM private key.

    Raises ValueError if a file is missing or unreadable, is not PEM of the expected kind, or the
    key does not belong to the certificate.
    """
    cert_bytes = _read(cert, "server certificate (--cert)")
    key_bytes = _read(key, "server private key (--key)")
    leaf = _load_certs(cert_bytes, cert)[0]
    try:
        private_key = serialization.load_pem_private_key(key_bytes, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{key}: not an unencrypted PEM private key (--key; {exc})") from exc
    if private_key.public_key() != leaf.public_key():
        raise ValueError(f"{key}: the private key (--key) does not match the certificate in "
                         f"{cert} (--cert)")
    return grpc.ssl_server_credentials(((key_bytes, cert_bytes),))


@dataclass(frozen=True)
class ServerTLS:
    """What the coordinator serves TLS with: gRPC's ``credentials`` and the ``names`` its
    certificate proves (:func:`certificate_names`), which a device's signed read must name."""

    credentials: grpc.ServerCredentials
    names: frozenset[str]


def server_tls(cert: Path, key: Path) -> ServerTLS:
    """:func:`server_credentials` and the names of the certificate in ``cert``."""
    return ServerTLS(server_credentials(cert, key), certificate_names(cert))


def certificate_names(cert: Path) -> frozenset[str]:
    """The host names and IP addresses the (leaf) certificate in the PEM file ``cert`` names, as
    TLS clients verify them: its subject alternative names (DNS names, wildcards included, and IP
    addresses), or its subject's common name when it has none; each written as
    :func:`fedsketch.common.net.device_reads.audience_name` writes it. ValueError if it names none."""
    leaf = _load_certs(_read(cert, "server certificate (--cert)"), cert)[0]
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [*san.get_values_for_type(x509.DNSName),
                 *map(str, san.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        hosts = [str(a.value) for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if not hosts:
        raise ValueError(f"{cert}: the certificate names no host (no subject alternative name, no "
                         "common name), so no device can verify it")
    return frozenset(audience_name(h) for h in hosts)


def channel_credentials(ca: Path) -> grpc.ChannelCredentials:
    """Client TLS credentials that trust only the PEM CA certificate(s) in ``ca``.

    Raises ValueError if the file is missing or unreadable or holds no PEM certificate.
    """
    ca_bytes = _read(ca, "CA certificate")
    _load_certs(ca_bytes, ca)
    return grpc.ssl_channel_credentials(root_certificates=ca_bytes)


def secure_channel(
    target: str, ca: Path | None, insecure: bool = False, options: list | None = None
) -> grpc.Channel:
    """A channel to ``target`` (``host:port``): TLS trusting ``ca``, or the system roots if ``ca`` is None.

    ``insecure=True`` is the explicit plaintext opt-out and makes an unencrypted channel; it cannot
    be combined with a ``ca`` (ValueError). Send and receive are capped at
    :data:`MAX_MESSAGE_BYTES`. A lost connection is tried again after 0.5 s, then with gRPC's
    backoff (× 1.6, jittered) up to 10 s apart (gRPC's default grows to 120 s), so a device
    reaches a restarted coordinator within seconds, in time for the stage it resumes.
    ``options`` (gRPC channel arguments as ``(key, value)`` pairs) are added to these and
    override them on equal keys.
    """
    merged = {
        "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
        "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
        "grpc.initial_reconnect_backoff_ms": 500,
        "grpc.max_reconnect_backoff_ms": 10_000,
    }
    merged.update(options or [])
    channel_options = list(merged.items())
    if insecure:
        if ca is not None:
            raise ValueError("insecure=True makes a plaintext channel; do not also pass a CA")
        return grpc.insecure_channel(target, options=channel_options)
    credentials = channel_credentials(ca) if ca is not None else grpc.ssl_channel_credentials()
    return grpc.secure_channel(target, credentials, options=channel_options)


def _parse_hosts(hosts: list[str]) -> list[x509.GeneralName]:
    """Subject alternative names for ``hosts``, in order and without duplicates."""
    if not hosts:
        raise ValueError("hosts must name at least one host name or IP address for the server certificate")
    names: list[x509.GeneralName] = []
    for host in hosts:
        host = host.strip()
        if not host:
            raise ValueError("hosts must not contain an empty name")
        try:
            name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            name = x509.DNSName(host)
        if name not in names:
            names.append(name)
    return names


def _key_usage(
    digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the TLS {what} ({exc.strerror or exc})") from exc


def _load_certs(data: bytes, path: Path) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"{path}: not a PEM certificate ({exc})") from exc
