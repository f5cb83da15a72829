"""TLS: the private CA and server certificate, and real gRPC calls over loopback with them."""

from __future__ import annotations

import ipaddress
import stat
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from fedsketch.common.net.tls import (
    MAX_MESSAGE_BYTES,
    CertPaths,
    channel_credentials,
    init_certs,
    secure_channel,
    server_credentials,
)

TIMEOUT = 5
HOSTS = ["localhost", "127.0.0.1", "::1"]


def _identity(b: bytes) -> bytes:
    return b


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertPaths:
    return init_certs(tmp_path_factory.mktemp("pki"), HOSTS)


@contextmanager
def _echo_server(paths: CertPaths):
    """A TLS echo server on 127.0.0.1 (ephemeral port); yields the port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(
        lambda req, ctx: req, request_deserializer=_identity, response_serializer=_identity
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Ping": handler}),))
    port = server.add_secure_port("127.0.0.1:0", server_credentials(paths.server_cert, paths.server_key))
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)


def _ping(channel: grpc.Channel, payload: bytes) -> bytes:
    call = channel.unary_unary(
        "/test.Echo/Ping", request_serializer=_identity, response_deserializer=_identity
    )
    return call(payload, timeout=TIMEOUT)


def test_init_certs_writes_a_valid_ca_and_server_certificate(certs):
    files = [certs.ca_cert, certs.ca_key, certs.server_cert, certs.server_key]
    assert [p.name for p in files] == ["ca.pem", "ca.key", "server.pem", "server.key"]
    assert all(p.is_file() for p in files)
    assert stat.S_IMODE(certs.ca_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(certs.server_key.stat().st_mode) == 0o600
    assert not list(certs.ca_cert.parent.glob(".*partial*"))

    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    leaf = x509.load_pem_x509_certificate(certs.server_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).critical
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert ca.public_key().curve.name == "secp256r1"

    # The signature on the server certificate is the CA's (raises InvalidSignature otherwise).
    ca.public_key().verify(
        leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm)
    )
    assert leaf.issuer == ca.subject
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    # Full path validation as a TLS client would do it, for a name and an address.
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(x509.DNSName("localhost"))
    assert verifier.verify(leaf, [])[-1] == ca
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(
        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    )
    verifier.verify(leaf, [])


def test_init_certs_refuses_to_overwrite(certs):
    before = {p: p.read_bytes() for p in (certs.ca_cert, certs.ca_key, certs.server_cert, certs.server_key)}
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        init_certs(certs.ca_cert.parent, ["localhost"])
    assert {p: p.read_bytes() for p in before} == before


def test_init_certs_refuses_if_any_file_exists(tmp_path):
    (tmp_path / "server.key").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="server.key"):
        init_certs(tmp_path, ["localhost"])
    assert [p.name for p in tmp_path.iterdir()] == ["server.key"]
    assert (tmp_path / "server.key").read_bytes() == b"mine"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_trusting_client_gets_the_echo(certs, host):
    with _echo_server(certs) as port, secure_channel(f"{host}:{port}", certs.ca_cert) as channel:
        assert _ping(channel, b"hello") == b"hello"


def test_client_with_another_ca_is_refused(certs, tmp_path):
    other = init_certs(tmp_path / "other", ["localhost", "127.0.0.1"])
    with _echo_server(certs) as port, secure_channel(f"localhost:{port}", other.ca_cert) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _ping(channel, b"hello")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_for_another_host_is_refused(tmp_path):
    paths = init_certs(tmp_path, ["coordinator.example"])
    with _echo_server(paths) as port, secure_channel(f"127.0.0.1:{port}", paths.ca_cert) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _ping(channel, b"hello")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_is_refused(certs):
    with _echo_server(certs) as port, secure_channel(f"127.0.0.1:{port}", None, insecure=True) as channel:
        with pytest.raises(grpc.RpcError) as info:
            _ping(channel, b"hello")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_oversized_message_is_refused_by_the_client(certs):
    with _echo_server(certs) as port, secure_channel(f"localhost:{port}", certs.ca_cert) as channel:
        assert len(_ping(channel, bytes(MAX_MESSAGE_BYTES - 1024))) == MAX_MESSAGE_BYTES - 1024
        with pytest.raises(grpc.RpcError) as info:
            _ping(channel, bytes(MAX_MESSAGE_BYTES + 1))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Sent message larger than max" in info.value.details()


def test_options_are_merged_and_override_the_limits(certs):
    options = [("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES), ("grpc.primary_user_agent", "t")]
    with _echo_server(certs) as port:
        with secure_channel(f"localhost:{port}", certs.ca_cert, options=options) as channel:
            with pytest.raises(grpc.RpcError) as info:
                _ping(channel, bytes(MAX_MESSAGE_BYTES + 1))
    # The client now sends it; the server's own (default 4 MiB) receive limit refuses it.
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Sent message" not in info.value.details()


@pytest.mark.parametrize("hosts", [[], ["  "]])
def test_init_certs_needs_hosts(tmp_path, hosts):
    with pytest.raises(ValueError, match="host"):
        init_certs(tmp_path / "pki", hosts)
    assert not (tmp_path / "pki").exists()


def test_missing_or_non_pem_files_are_clear_errors(certs, tmp_path):
    missing = tmp_path / "nope.pem"
    with pytest.raises(ValueError, match="nope.pem: cannot read"):
        server_credentials(missing, certs.server_key)
    with pytest.raises(ValueError, match="nope.pem: cannot read"):
        channel_credentials(missing)
    with pytest.raises(ValueError, match="nope.pem: cannot read"):
        secure_channel("localhost:1", missing)
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"not a certificate\n")
    with pytest.raises(ValueError, match="junk.pem: not a PEM certificate"):
        channel_credentials(junk)
    with pytest.raises(ValueError, match="junk.pem: not a PEM certificate"):
        server_credentials(junk, certs.server_key)
    with pytest.raises(ValueError, match="junk.pem: not an unencrypted PEM private key"):
        server_credentials(certs.server_cert, junk)
    with pytest.raises(ValueError, match="does not match"):
        server_credentials(certs.server_cert, certs.ca_key)


def test_insecure_with_a_ca_is_ambiguous(certs):
    with pytest.raises(ValueError, match="plaintext"):
        secure_channel("localhost:1", certs.ca_cert, insecure=True)
