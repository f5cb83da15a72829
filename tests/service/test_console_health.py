"""The standard gRPC health service of a real ``coordinator serve`` process (TLS on loopback):
SERVING while its store answers; NOT_SERVING while the store cannot be written (the process's
file-size limit set to one byte with prlimit(2): every write to a file fails with EFBIG, as on
a full disk, while sockets and reads go on); SERVING again once the limit is lifted, and the
store takes writes again. ``coordinator health`` (what the systemd units run) says the same."""

from __future__ import annotations

import resource
import time
from urllib.parse import urlsplit

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_round_processes import CoordinatorProcess, cli

from fedsketch.common.net.tls import secure_channel

pytestmark = pytest.mark.slow
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def wait_status(stub, expected: int, service: str = "", timeout: float = 60.0) -> None:
    """Until the service says ``expected`` (the probe runs every 2 s; a generous bound)."""
    stop = time.monotonic() + timeout
    request = health_pb2.HealthCheckRequest(service=service)
    while (status := stub.Check(request, timeout=10).status) != expected:
        assert time.monotonic() < stop, f"still {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
        time.sleep(0.1)


def health_cli(c: CoordinatorProcess):
    return cli("coordinator", "health", "--coordinator", c.target, "--ca", str(c.certs / "ca.pem"),
               check=False)


def test_health_follows_whether_the_store_takes_writes(tmp_path, cli_certs):
    c = CoordinatorProcess(tmp_path, cli_certs)
    c.start()
    channel = secure_channel(c.target, cli_certs / "ca.pem")
    stub = health_pb2_grpc.HealthStub(channel)
    soft, hard = resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE)
    try:
        for service in ("", "fedsketch.v1.Device", "fedsketch.v1.Operator"):
            wait_status(stub, SERVING, service, timeout=0)  # from the first call
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        ok = health_cli(c)
        assert ok.returncode == 0 and ok.stdout == "SERVING\n", ok.stderr

        resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE, (1, hard))  # a full disk, for it alone
        wait_status(stub, NOT_SERVING)
        wait_status(stub, NOT_SERVING, "fedsketch.v1.Device", timeout=0)
        sick = health_cli(c)
        assert sick.returncode == 1 and sick.stderr.startswith("error: ") and "NOT_SERVING" in sick.stderr
        assert sick.stderr.count("\n") == 1
        refused = c.op("tokens", check=False)  # the store really refuses writes meanwhile
        assert refused.returncode == 1

        resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
        wait_status(stub, SERVING)
        assert health_cli(c).returncode == 0
        assert len(c.op("tokens", "--count", "2").stdout.split()) == 2  # and takes them again
        assert c.proc.poll() is None
    finally:
        channel.close()
        if c.proc.poll() is None:
            resource.prlimit(c.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
            assert c.terminate() == 0


def test_health_follows_whether_postgresql_answers(tmp_path, cli_certs, postgres_server, postgres_url):
    """A coordinator on the tests' PostgreSQL server: NOT_SERVING while its database takes no
    connection and the ones it held are terminated (what a client sees of a server going down:
    ``terminating connection due to administrator command``, then connections refused), SERVING
    again once the database takes connections, and the store writes again."""
    name = urlsplit(postgres_url).path.lstrip("/")
    c = CoordinatorProcess(tmp_path, cli_certs)
    c.db = postgres_url
    c.start()
    channel = secure_channel(c.target, cli_certs / "ca.pem")
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        wait_status(stub, SERVING, timeout=0)
        postgres_server.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        postgres_server.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                f"WHERE datname = '{name}'")
        wait_status(stub, NOT_SERVING)
        assert health_cli(c).returncode == 1
        postgres_server.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        wait_status(stub, SERVING)
        assert len(c.op("tokens").stdout.split()) == 1
    finally:
        channel.close()
        postgres_server.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        if c.proc.poll() is None:
            assert c.terminate() == 0
