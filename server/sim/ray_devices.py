"""``simulate --backend ray``: the devices of a simulation run as Ray actors, on a local Ray or
on a cluster (``--address``); the coordinator stays in the driver's process.

Each actor (:class:`DeviceHost`) hosts a contiguous block of the L devices: it writes
the study's CA certificate into a temporary folder of its own node, enrolls its devices (the
same :func:`~fedsketch.server.sim.devices.make_agents` as the in-process backend: one ledger,
one TLS channel and one :class:`~fedsketch.client.agent.Agent` per device) and steps them when
the driver asks. The driver's loop (:func:`~fedsketch.server.sim.devices.drive`) is the
in-process backend's, with one pass stepping every actor at once. There are max(min(L, C),
⌈L / :data:`MAX_DEVICES_PER_ACTOR`⌉) actors for C CPUs in the cluster, each asking C / actors
CPUs: a device's ledger holds three files open (SQLite's database, WAL and shared memory), so
an actor raises its soft limit of open files to the hard one and hosts at most 1000 devices.
The coordinator listens on 127.0.0.1 for a local Ray, and on the driver node's IP address (Ray's
``get_node_ip_address``) with ``--address``, which every node must reach; its certificate names
that address. Every node needs fedsketch installed with the ``ray`` extra.

Memory per device: each actor reads its peak resident set (:func:`peak_rss_bytes`) when it
starts and after the round; the growth divided by its devices is what a device costs there
(ledger, channel, agent, records), in bytes.
"""

from __future__ import annotations

import math
import os
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.devices import drive, make_agents, step_agents

#: Most devices one actor hosts (3 open files each: module docstring).
MAX_DEVICES_PER_ACTOR = 1000
#: Seconds a local Ray's GCS server gets to start (Ray's ``RAY_gcs_server_port_wait_time_s``).
GCS_WAIT = "180"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install 'fedsketch[ray]'") from None
    return ray


def peak_rss_bytes() -> int:
    """This process's peak resident set, in bytes: ``VmHWM`` of /proc/self/status on Linux (the
    peak of this program image; ``ru_maxrss`` also keeps the high-water mark from before the
    process's exec, e.g. of the process it was forked from), else ``ru_maxrss`` (bytes on macOS)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def check_reachable(address: str, seconds: float = 10.0) -> None:
    """ValueError in words unless a TCP connection to a Ray cluster's ``HOST:PORT`` (or
    ``ray://HOST:PORT``) opens within ``seconds``: ``ray.init`` itself retries an unreachable
    address for minutes and ignores SIGINT while it does. ``auto`` (a cluster this machine
    belongs to) is left to Ray."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isascii() or not port.isdigit():
        raise ValueError(f"--address takes HOST:PORT (or auto), got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except OSError as exc:
        raise ValueError(f"cannot reach Ray at {address}: {exc.strerror or exc}") from None


def init_ray(**options) -> None:
    """``ray.init(**options)`` for a simulation: its GCS server gets :data:`GCS_WAIT` seconds to
    start unless ``RAY_gcs_server_port_wait_time_s`` says otherwise, and a local start whose
    raylet missed Ray's fixed 30 s to register ("The current node timed out during startup",
    seen once in a fresh-clone test run on a busy 2-core machine) is shut down and tried once
    more."""
    ray = _ray()
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", GCS_WAIT)
    kwargs = {"include_dashboard": False, "logging_level": "WARNING", **options}
    try:
        ray.init(**kwargs)
    except Exception as exc:  # Ray raises a bare Exception for this
        if options.get("address") is not None or "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        ray.init(**kwargs)


@contextmanager
def ray_session(address: str | None) -> Iterator[str]:
    """Ray for a simulation; yields the host the coordinator must listen on (127.0.0.1 for a
    local Ray, the driver node's IP with ``address``). A Ray already initialised in this
    process is used as it is and left running; one started here (:func:`init_ray`) is shut down
    after."""
    ray = _ray()
    started = not ray.is_initialized()
    if started:
        if address is not None:
            check_reachable(address)
        init_ray(address=address)
    try:
        yield "127.0.0.1" if address is None else ray.util.get_node_ip_address()
    finally:
        if started:
            ray.shutdown()


class DeviceHost:
    """A Ray actor's body: devices ``first``, ``first + 1``, … of a simulation (module docstring)."""

    def __init__(self, target: str, ca_pem: bytes, first: int, tokens: list[str],
                 records: list[np.ndarray], epsilon: float) -> None:
        self._start_rss = peak_rss_bytes()
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self._stack = ExitStack()
        folder = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="fedsketch-ray-")))
        ca = folder / "ca.pem"
        ca.write_bytes(ca_pem)
        self._agents = make_agents(self._stack, target, ca, folder, tokens, records, epsilon, first)
        self._step = step_agents(self._agents, first)

    def step(self, skip: Collection[int]) -> list[tuple[int, bool, dict[str, str]]]:
        """One pass of every device here not in ``skip`` (global indices)."""
        return self._step(skip)

    def report(self) -> dict:
        """Devices hosted, bytes they sent, and the peak resident set at start and now."""
        return {"devices": len(self._agents), "bytes_sent": sum(a.bytes_sent for a in self._agents),
                "start_peak_rss_bytes": self._start_rss, "peak_rss_bytes": peak_rss_bytes()}

    def close(self) -> None:
        """Close every ledger and channel and remove the folder."""
        self._stack.close()


def run_on_ray(target: str, ca: Path, tokens: list[str], records: list[np.ndarray], epsilon: float,
               cfg: SimConfig, watch: Callable[[], pb.Study], seconds: dict[str, float]) -> dict:
    """Enroll and drive the devices on the Ray this process is connected to; ``seconds`` gets
    ``enroll`` and ``devices``. Returns the report's ``ray`` entry: actors, devices per actor,
    their peak resident sets, the growth per device, and the devices' bytes sent."""
    ray = _ray()
    cpus = ray.cluster_resources().get("CPU", 1.0)
    hosts_n = max(1, min(len(tokens), int(cpus)), math.ceil(len(tokens) / MAX_DEVICES_PER_ACTOR))
    host_cls = ray.remote(num_cpus=min(1.0, cpus / hosts_n))(DeviceHost)
    t = time.perf_counter()
    blocks = np.array_split(np.arange(len(tokens)), hosts_n)
    ca_pem = ca.read_bytes()
    hosts = [host_cls.remote(target, ca_pem, int(b[0]), [tokens[i] for i in b],
                             [records[i] for i in b], epsilon) for b in blocks]
    try:
        ray.get([h.report.remote() for h in hosts])  # every device enrolled
        seconds["enroll"] = time.perf_counter() - t
        t = time.perf_counter()

        def step_all(skip: Collection[int]) -> list[tuple[int, bool, dict[str, str]]]:
            passes = ray.get([h.step.remote(frozenset(skip)) for h in hosts])
            return [o for stepped in passes for o in stepped]

        drive(step_all, len(tokens), cfg, watch)
        seconds["devices"] = time.perf_counter() - t
        reports = ray.get([h.report.remote() for h in hosts])
        ray.get([h.close.remote() for h in hosts])
    finally:
        for h in hosts:
            ray.kill(h)
    growth = [r["peak_rss_bytes"] - r["start_peak_rss_bytes"] for r in reports]
    return {"actors": hosts_n, "devices_per_actor": [r["devices"] for r in reports],
            "peak_rss_bytes": [r["peak_rss_bytes"] for r in reports],
            "rss_growth_per_device_bytes": sum(growth) / len(tokens),
            "bytes_sent": sum(r["bytes_sent"] for r in reports)}
