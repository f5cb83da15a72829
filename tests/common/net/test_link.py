"""``--coordinator`` with several coordinators: the list becomes gRPC's ipv4:/ipv6: target, calls
go round robin over real TLS servers on loopback, and a bad list is refused by name."""

from __future__ import annotations

from concurrent import futures
from contextlib import ExitStack

import grpc
import pytest

from fedsketch.common.net.link import Link, grpc_target
from fedsketch.common.net.tls import init_certs, server_credentials


def _server(certs, hits: dict[int, int], name: int) -> tuple[grpc.Server, int]:
    """A TLS server on 127.0.0.1 counting its calls under ``name``."""
    def count(request: bytes, context) -> bytes:
        hits[name] = hits.get(name, 0) + 1
        return request

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(count, request_deserializer=bytes,
                                                  response_serializer=bytes)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Ping": handler}),))
    port = server.add_secure_port("127.0.0.1:0", server_credentials(certs.server_cert, certs.server_key))
    server.start()
    return server, port


@pytest.mark.parametrize(("target", "expected"), [
    ("coord.example:7443", ("coord.example:7443", None)),
    ("10.0.0.1:7443, 10.0.0.2:7444", ("ipv4:10.0.0.1:7443,10.0.0.2:7444", "10.0.0.1")),
    ("[::1]:7443,[fe80::2]:7443", ("ipv6:[::1]:7443,[fe80::2]:7443", "[::1]")),
])
def test_a_list_becomes_grpcs_target_verified_against_its_first_address(target, expected):
    assert grpc_target(target) == expected


@pytest.mark.parametrize(("target", "message"), [
    ("a.example:7443,b.example:7443", "'a.example:7443' is not IP:PORT"),
    ("10.0.0.1:7443,10.0.0.2", "'10.0.0.2' is not IP:PORT"),
    ("10.0.0.1:7443,10.0.0.2:70000", "'10.0.0.2:70000' is not IP:PORT"),
    ("10.0.0.1:7443,::1:7443", "'::1:7443' is not IP:PORT ([IP]:PORT for IPv6)"),
    ("10.0.0.1:7443,", "'' is not IP:PORT"),
    ("10.0.0.1:7443,[::1]:7443", "mixes IPv4 and IPv6"),
])
def test_a_bad_list_is_refused_naming_the_entry(target, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        grpc_target(target)


def test_calls_go_round_robin_over_every_listed_coordinator(tmp_path):
    certs = init_certs(tmp_path / "pki", ["127.0.0.1"])
    hits: dict[int, int] = {}
    with ExitStack() as stack:
        ports = []
        for name in range(3):
            server, port = _server(certs, hits, name)
            stack.callback(server.stop, None)
            ports.append(port)
        link = Link(",".join(f"127.0.0.1:{p}" for p in ports), certs.ca_cert, insecure=False)
        assert link.host == "127.0.0.1"
        channel = link.channel()
        stack.callback(channel.close)
        ping = channel.unary_unary("/test.Echo/Ping", request_serializer=bytes, response_deserializer=bytes)
        grpc.channel_ready_future(channel).result(timeout=10)
        for _ in range(30):
            assert ping(b"x", timeout=10) == b"x"
    assert sorted(hits) == [0, 1, 2] and sum(hits.values()) == 30
    assert min(hits.values()) >= 5, hits  # spread, not pinned to the first ready address


def test_a_list_is_verified_against_its_first_address(tmp_path):
    """Certificates that do not name the list's first address are refused, as for one address."""
    certs = init_certs(tmp_path / "pki", ["localhost"])
    hits: dict[int, int] = {}
    server, port = _server(certs, hits, 0)
    try:
        channel = Link(f"127.0.0.1:{port},127.0.0.1:{port}", certs.ca_cert, insecure=False).channel()
        ping = channel.unary_unary("/test.Echo/Ping", request_serializer=bytes, response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as err:
            ping(b"x", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and not hits
        channel.close()
    finally:
        server.stop(None)
