"""The standard gRPC health service (``grpc.health.v1.Health``, from ``grpcio-health-checking``)
on the coordinator's own port, so that a load balancer in front of shared coordinators, or
systemd, routes around a sick one.

Every :data:`PROBE_SECONDS` a thread asks the store to answer (:func:`store_answers`); the
service says SERVING while the last probe succeeded within :data:`PROBE_TIMEOUT` seconds, and
NOT_SERVING after one that failed or is still waiting past it, for the overall service ("") and
for each of ``fedsketch.v1.Device`` and ``fedsketch.v1.Operator``. The first probe runs before
the server takes calls. ``fedsketch_store_healthy`` (:mod:`.metrics`) follows the same answer.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as ProbeTimeout

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedsketch.server.store.base import ACCEPTING, Store

log = logging.getLogger("fedsketch.coordinator")

#: Seconds between two probes, and the most one may take before the service is NOT_SERVING.
PROBE_SECONDS, PROBE_TIMEOUT = 2.0, 5.0
#: The services whose status is reported ("" is the whole server's).
SERVICES = ("", "fedsketch.v1.Device", "fedsketch.v1.Operator")
#: Bytes the probe writes and syncs beside a SQLite store: one filesystem block.
PROBE_BYTES = 4096


def store_answers(store: Store) -> None:
    """Return if the store answers, raise (any exception) if not: it must read (the studies that
    accept input: a database that is down, or unreachable, fails here) and, for a SQLite file,
    its folder must take a durable write (a full or read-only disk, or a file-size limit, fails
    here, before SQLite's next commit does): :data:`PROBE_BYTES` written, synced and removed
    again. Only the store's public interface and its file's path are used."""
    store.list_studies(ACCEPTING)
    path = getattr(store, "path", None)
    if path is None:
        return
    scratch = f"{path}.health-probe"
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = os.write(fd, b"\0" * PROBE_BYTES)
        if written != PROBE_BYTES:
            raise OSError(f"short write to {scratch}: {written} of {PROBE_BYTES} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(scratch)


class StoreHealth:
    """The probe thread and the health servicer it sets (module docstring)."""

    def __init__(self, store: Store, on_change: Callable[[bool], None] = lambda ok: None,
                 probe: Callable[[Store], None] = store_answers) -> None:
        self.servicer = health.HealthServicer()
        self._store, self._probe, self._on_change = store, probe, on_change
        self._stop = threading.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health-probe")
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)
        self.serving: bool | None = None

    def add_to(self, server: grpc.Server) -> None:
        """Probe once, then register the service on ``server`` (before it starts) and keep probing."""
        self._check()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        self._thread.start()

    def _check(self) -> None:
        future = self._worker.submit(self._probe, self._store)
        try:
            future.result(timeout=PROBE_TIMEOUT)
            self._set(True, "")
        except ProbeTimeout:
            self._set(False, f"no answer within {PROBE_TIMEOUT:g} s")
            while not self._stop.is_set():  # one probe at a time: wait for the stuck one
                try:
                    future.result(timeout=PROBE_SECONDS)
                    break
                except ProbeTimeout:
                    continue
                except Exception:  # noqa: BLE001 - reported by the next probe
                    break
        except Exception as exc:  # noqa: BLE001 - any failure means the store does not answer
            self._set(False, f"{type(exc).__name__}: {exc}")

    def _set(self, serving: bool, why: str) -> None:
        if serving != self.serving:
            if serving:
                log.info("health: the store answers; SERVING")
            else:
                log.warning("health: the store does not answer (%s); NOT_SERVING", why)
            status = (health_pb2.HealthCheckResponse.SERVING if serving
                      else health_pb2.HealthCheckResponse.NOT_SERVING)
            for service in SERVICES:
                self.servicer.set(service, status)
            self._on_change(serving)
        self.serving = serving

    def _loop(self) -> None:
        while not self._stop.wait(PROBE_SECONDS):
            self._check()

    def stop(self) -> None:
        """Stop probing and answer NOT_SERVING from now on (the server is shutting down)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._worker.shutdown(wait=False)
        self.servicer.enter_graceful_shutdown()
