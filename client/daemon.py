"""The device daemon: poll the coordinator with backoff and jitter, contribute, stop on request.

One loop around :class:`fedsketch.client.agent.Agent`. Each pass re-sends unacknowledged
releases, then handles every open study once. While the device waits in a roster that is not
full yet (its reservation of the study is live: :attr:`Agent.waiting`), and while it takes part
in a secure-aggregation round, it polls every ``poll`` seconds (with jitter), so it sends soon
after input opens, and answers each stage before the stage's timeout.
After a pass that did nothing, or a pass that failed (coordinator unreachable, an RPC
refused), the next poll waits ``min(max_poll, poll·2^failures)`` seconds times a uniform jitter
in [0.5, 1.5), so many devices do not poll in lock-step. Enrolling is retried the same way
while the coordinator cannot be reached (a wrong token is final). Setting ``stop`` (the CLI does
so on SIGTERM and SIGINT) ends the loop at once: between passes, or while the device reads its
records for a sketch (:class:`~fedsketch.client.localdata.Stopped`, raised between chunks, before
anything is spent); a spend already recorded is sent before the daemon exits, so the ledger and
the coordinator stay consistent.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Budget, Ledger, LedgerError, LedgerUnavailable
from fedsketch.client.ledger_records import check_budget
from fedsketch.client.localdata import LocalData, Stopped, stoppable
from fedsketch.common.cli import rpc_words
from fedsketch.common.data.dataio import AS_IS, DataSource, ReadOptions
from fedsketch.common.net.link import Link
from fedsketch.common.sketch.dask_records import open_records

log = logging.getLogger("fedsketch.device")
_jitter = random.SystemRandom()


@dataclass(frozen=True)
class DaemonConfig:
    """Everything ``fedsketch device run`` takes (see its --help)."""

    coordinator: str
    data: Path
    ledger: Path
    budget: float | None = None
    budget_delta: float | None = None
    source: str = DEFAULT_SOURCE
    ca: Path | None = None
    insecure: bool = False
    token: str | None = None
    label: str = ""
    once: bool = False
    poll: float = 2.0
    max_poll: float = 60.0
    read: ReadOptions = AS_IS
    engine: str = "local"  # "dask": data is a Parquet folder summed on a Dask cluster
    scheduler: str | None = None  # the Dask scheduler's address; None: a local cluster per sum


#: Enroll errors worth another try later: the coordinator is down, overloaded or restarting.
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.RESOURCE_EXHAUSTED)


def local_data(path: Path, options: ReadOptions = AS_IS,
               stop: threading.Event | None = None, engine: str = "local",
               scheduler: str | None = None) -> LocalData:
    """The data file as it is now, read as ``options`` say (``--header/--no-header``,
    ``--columns``), as the agent sees it: streamed chunks of this version of the file (DataError
    once it is replaced or rewritten) and its dimension d. The agent calls this for every study,
    so a new file is read with its own layout. A file without records is accepted: under
    add/remove the device takes part with n = 0 (declining would reveal it); under replace-one
    the study is refused (n is public there). With ``stop``, every read ends with
    :class:`~fedsketch.client.localdata.Stopped` once it is set.

    ``engine`` "dask": ``path`` is a folder of Parquet partitions summed on the Dask cluster at
    ``scheduler`` (:class:`~fedsketch.common.sketch.dask_records.DaskRecords`): its n and d come
    from the partitions' metadata, and ``stop`` is not seen during a sum: a stop waits for the
    running sum, its release and its spend. ``scheduler`` with the local engine is refused."""
    if engine != "local" or scheduler is not None:
        records = open_records(path, engine, scheduler, options,
                               lambda: DataSource(path, allow_empty=True, options=options))
        return LocalData(records.chunks, records.d, records.n)
    source = DataSource(path, allow_empty=True, options=options)
    if stop is None:
        return LocalData(source.chunks, source.d)
    return LocalData(lambda: stoppable(source.chunks(), stop), source.d)


def command_line_budget(ledger: Ledger, source: str, epsilon: float | None,
                        delta: float | None) -> Budget:
    """The budget of ``source`` after the daemon's ``--budget`` / ``--budget-delta``.

    On a ledger without any source (the first run) they declare ``source``. Afterwards they can
    only lower its budget: a larger value is ignored with a warning, since raising is the owner's
    separate ``fedsketch device raise-budget``. A source the ledger does not know is refused once
    the ledger has any (a new name must not be a way to a fresh budget). ValueError for a value
    that is no budget (NaN, ≤ 0, δ ≥ 1), whether or not it would change anything."""
    check_budget(1.0 if epsilon is None else epsilon, 0.0 if delta is None else delta)
    known = ledger.sources()
    if source not in known:
        if known:
            raise LedgerError(f"{ledger.path} has no source {source!r} (declared: "
                              f"{', '.join(map(repr, known))}); an owner whose data holds other "
                              "people declares it with `fedsketch device add-source`")
        if epsilon is None:
            raise LedgerError(f"{ledger.path} holds no budget yet: give --budget on the first run, "
                              "or set it with `fedsketch device init`")
        return ledger.declare(source, epsilon, 0.0 if delta is None else delta, action="init")
    stored = known[source]
    lower_eps = epsilon if epsilon is not None and epsilon < stored.epsilon else None
    lower_delta = delta if delta is not None and delta < stored.delta else None
    if (epsilon is not None and epsilon > stored.epsilon) or (delta is not None and delta > stored.delta):
        log.warning("the ledger's budget for source %r is ε = %g, δ = %g; --budget / --budget-delta "
                    "cannot raise it (use `fedsketch device raise-budget`)", source, stored.epsilon,
                    stored.delta)
    if lower_eps is None and lower_delta is None:
        return stored
    new = ledger.lower(source, lower_eps, lower_delta)
    log.info("lowered the budget of source %r to ε = %g, δ = %g", source, new.epsilon, new.delta)
    return new


def backoff(failures: int, poll: float, max_poll: float) -> float:
    """Seconds before the next poll after ``failures`` idle or failed passes (with jitter)."""
    return min(max_poll, poll * 2.0 ** min(failures, 20)) * _jitter.uniform(0.5, 1.5)


def run(cfg: DaemonConfig, stop: threading.Event) -> int:
    """Run until ``stop`` is set (or one pass with ``once``); the exit status (0 = clean)."""
    # a missing or unreadable file stops the daemon before it enrolls; what the reader decided
    # on its own (a header, pandas' index column left out) goes to the log once
    opened = open_records(cfg.data, cfg.engine, cfg.scheduler, cfg.read,
                          lambda: DataSource(cfg.data, allow_empty=True, options=cfg.read))
    for note in opened.notes:
        log.info("%s: %s", cfg.data, note)
    ledger = Ledger(cfg.ledger)
    try:
        command_line_budget(ledger, cfg.source, cfg.budget, cfg.budget_delta)
        policy = ledger.policy()
        if not policy.allows_coordinator(cfg.coordinator):
            raise LedgerError(f"the device's policy works only for coordinators "
                              f"{' or '.join(policy.coordinators)}, not {cfg.coordinator!r}")
    except BaseException:
        ledger.close()
        raise
    link = Link(cfg.coordinator, cfg.ca, cfg.insecure)
    channel = link.channel()
    try:
        agent = Agent(channel, ledger, lambda: local_data(cfg.data, cfg.read, stop, cfg.engine,
                                                                cfg.scheduler), cfg.source)
        if not _enroll(agent, cfg, link, stop):
            return 1 if cfg.once else 0
        failures = 0
        while not stop.is_set():
            try:
                out = agent.step()
            except Stopped:
                break
            except grpc.RpcError as exc:
                log.warning("coordinator: %s", rpc_words(exc, link))
                if cfg.once:
                    return 1
                failures += 1
            except LedgerUnavailable as exc:  # nothing recorded, nothing sent: try again later
                if cfg.once:
                    raise
                log.warning("ledger: %s", exc)
                failures += 1
            else:
                for study_id in out.submitted + out.resent:
                    log.info("submitted study %s", study_id)
                busy = out.submitted or out.resent or out.registered or agent.waiting
                failures = 0 if busy else failures + 1
            if cfg.once:
                return 0
            stop.wait(backoff(failures, cfg.poll, cfg.max_poll))
        log.info("stopped")
        return 0
    finally:
        channel.close()
        ledger.close()


def _enroll(agent: Agent, cfg: DaemonConfig, link: Link, stop: threading.Event) -> bool:
    """Enroll (or find the stored identity), trying again with backoff while the coordinator
    cannot be reached; False if stopped first, or at the first failure with ``once``. The key
    is the same on every try (:meth:`Agent.ensure_enrolled`), so a retry after a lost reply is
    answered with the same device id. Other errors (a refused token) propagate."""
    failures = 0
    while not stop.is_set():
        try:
            agent.ensure_enrolled(cfg.coordinator, cfg.token, cfg.label)
            return True
        except grpc.RpcError as exc:
            if exc.code() not in TRANSIENT:
                raise
            log.warning("cannot enroll yet: %s", rpc_words(exc, link))
            if cfg.once:
                return False
            failures += 1
            stop.wait(backoff(failures, cfg.poll, cfg.max_poll))
    log.info("stopped")
    return False
