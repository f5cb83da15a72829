"""The device daemon: poll the coordinator with backoff and jitter, contribute, stop on request.

One loop around :class:`fedsketch.client.agent.Agent`. Each pass re-sends unacknowledged
releases, then handles every open study once. After a pass that did nothing, or a pass that
failed (coordinator unreachable, an RPC refused), the next poll waits
``min(max_poll, poll·2^failures)`` seconds times a uniform jitter in [0.5, 1.5), so many devices
do not poll in lock-step. Setting ``stop`` (the CLI does so on SIGTERM and SIGINT) ends the loop
between passes; a pass in progress finishes, so the ledger and the coordinator stay consistent.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from fedsketch.common.dataio import DataSource
from fedsketch.common.tls import secure_channel

from .agent import Agent, LocalData
from .ledger import Ledger, fingerprint_file

log = logging.getLogger("fedsketch.device")
_jitter = random.SystemRandom()


@dataclass(frozen=True)
class DaemonConfig:
    """Everything ``fedsketch device run`` takes (see its --help)."""

    coordinator: str
    data: Path
    ledger: Path
    budget: float
    ca: Path | None = None
    insecure: bool = False
    token: str | None = None
    label: str = ""
    once: bool = False
    poll: float = 2.0
    max_poll: float = 60.0


def local_data(path: Path) -> LocalData:
    """A data file as the agent sees it: streamed chunks, n, d, and a content fingerprint."""
    source = DataSource(path)
    return LocalData(source.chunks, source.n, source.d, fingerprint_file(path))


def backoff(failures: int, poll: float, max_poll: float) -> float:
    """Seconds before the next poll after ``failures`` idle or failed passes (with jitter)."""
    return min(max_poll, poll * 2.0 ** min(failures, 20)) * _jitter.uniform(0.5, 1.5)


def run(cfg: DaemonConfig, stop: threading.Event) -> int:
    """Run until ``stop`` is set (or one pass with ``once``); the exit status (0 = clean)."""
    data = local_data(cfg.data)
    ledger = Ledger(cfg.ledger, cfg.budget)
    channel = secure_channel(cfg.coordinator, cfg.ca, insecure=cfg.insecure)
    try:
        agent = Agent(channel, ledger, data)
        agent.ensure_enrolled(cfg.coordinator, cfg.token, cfg.label)
        failures = 0
        while not stop.is_set():
            try:
                out = agent.step()
            except grpc.RpcError as exc:
                log.warning("coordinator: %s: %s", exc.code().name, exc.details())
                if cfg.once:
                    return 1
                failures += 1
            else:
                for study_id in out.submitted + out.resent:
                    log.info("submitted study %s", study_id)
                failures = 0 if (out.submitted or out.resent) else failures + 1
            if cfg.once:
                return 0
            stop.wait(backoff(failures, cfg.poll, cfg.max_poll))
        log.info("stopped")
        return 0
    finally:
        channel.close()
        ledger.close()
