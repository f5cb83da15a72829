"""``fedsketch coordinator health``: ask a coordinator's standard gRPC health service
(:mod:`fedsketch.server.console.health`) whether it serves, as a load balancer or systemd's
``ExecStartPost`` does. Exit status 0 for SERVING; otherwise one ``error:`` line and 1."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from fedsketch.common.cli import CaOpt, InsecureOpt, Target, connect
from fedsketch.server.cli.errors import clean_errors

#: Seconds between two checks while waiting, and the deadline of one check.
POLL_SECONDS, CHECK_SECONDS = 0.5, 5.0


def health(
    coordinator: Target,
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    wait: Annotated[float, typer.Option(
        help="Seconds to wait for SERVING (the coordinator may be starting); 0: ask once.")] = 0.0,
    service: Annotated[str, typer.Option(
        help="The service asked about: '' (the coordinator), fedsketch.v1.Device or "
        "fedsketch.v1.Operator.")] = "",
) -> None:
    """Exit 0 if the coordinator's health service says SERVING (its store answers), else say
    why and exit 1. Needs no token: the health service tells anyone who may connect."""
    import grpc  # here, not at the top: the command line starts without grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with clean_errors():
        stub = health_pb2_grpc.HealthStub(connect(coordinator, ca, insecure))
        stop = time.monotonic() + wait
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service),
                                    timeout=CHECK_SECONDS).status
                why = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as exc:
                if time.monotonic() >= stop:
                    raise
                status, why = None, exc.code().name
            if status == health_pb2.HealthCheckResponse.SERVING:
                typer.echo("SERVING")
                return
            if time.monotonic() >= stop:
                raise ValueError(f"coordinator {coordinator} is {why}: its store does not answer "
                                 "(its log says why)")
            time.sleep(POLL_SECONDS)
