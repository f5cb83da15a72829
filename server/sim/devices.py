"""A simulation's devices, whoever runs them: enrolled in-process agents (:func:`make_agents`),
and the driver's loop (:func:`drive`) that steps them until the study's round is over.

The loop only sees :data:`StepAll`: step every device not in a given set once, and say which
submitted and which refused. The in-process backend steps its agents one after another
(:func:`step_agents`); the Ray backend (:mod:`fedsketch.server.sim.ray_devices`) steps the
agents of each of its hosts in parallel. Either way the same protocol code runs per device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.net.tls import secure_channel
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import Stage
from fedsketch.common.secagg import wire as sw
from fedsketch.server.bench.metrics import split
from fedsketch.server.sim.hostile import HostileAgent

if TYPE_CHECKING:
    from fedsketch.server.sim.config import SimConfig

#: Secure-aggregation stages in order, and those a simulated device may drop out at.
DROPOUT_STAGES = tuple(stage.value for stage in Stage)

#: One step of the devices: ``skip`` (global device indices left silent) -> for each device
#: stepped, (its index, whether it submitted, the studies it refused with each reason).
StepAll = Callable[[Collection[int]], list[tuple[int, bool, dict[str, str]]]]


def make_agents(stack: ExitStack, target: str, ca: Path, folder: Path, tokens: list[str],
                records: list[np.ndarray], epsilon: float, first: int = 0,
                hostile: tuple[Collection[int], str] = ((), ""), delta: float = 0.0) -> list[Agent]:
    """Enrolled in-process devices ``first``, ``first + 1``, …, each with its records (an
    (n_i, d) array), its own ledger in ``folder`` with budget ``epsilon``, and TLS channel to
    ``target`` trusting ``ca``; ``stack`` closes them; ``delta`` their δ budget (a validated
    study's spends carry one: :func:`~fedsketch.common.study.validated.validity_delta`). The
    devices whose index is in ``hostile`` = (indices, kind) are :class:`~.hostile.HostileAgent`
    of that kind."""
    agents = []
    for j, (token, xi) in enumerate(zip(tokens, records, strict=True)):
        data = LocalData(lambda xi=xi: split(xi), xi.shape[1])
        ledger = Ledger.create(folder / f"device{first + j}.ledger", epsilon, delta)
        stack.callback(ledger.close)
        channel = secure_channel(target, ca)
        stack.callback(channel.close)
        agent = (HostileAgent(channel, ledger, lambda data=data: data, kind=hostile[1])
                 if first + j in hostile[0] else Agent(channel, ledger, lambda data=data: data))
        agent.ensure_enrolled(target, token, f"sim-{first + j}")
        agents.append(agent)
    return agents


def step_agents(agents: list[Agent], first: int = 0) -> StepAll:
    """:data:`StepAll` over ``agents`` (devices ``first``, ``first + 1``, …), one after another."""
    def step_all(skip: Collection[int]) -> list[tuple[int, bool, dict[str, str]]]:
        stepped = []
        for j, agent in enumerate(agents):
            if first + j not in skip:
                out = agent.step()
                stepped.append((first + j, bool(out.submitted), dict(out.refused)))
        return stepped
    return step_all


def drive(step_all: StepAll, devices: int, cfg: SimConfig, watch: Callable[[], pb.Study]) -> None:
    """Plain round: passes until every device has contributed (the first fills the roster); with
    later rounds, until the study is done or failed. Secure round: passes until the study is
    closed (or ends, with later rounds), the chosen devices silent from ``dropout_stage`` on."""
    later = cfg.rounds or cfg.scale is None  # refinement rounds, or a sketch after round 0
    if not cfg.secure_aggregation:
        pending = set(range(devices))
        while pending or (later and watch().state not in (pb.DONE, pb.FAILED)):
            sent = False
            for i, submitted, refused in step_all(()):
                if refused:
                    raise RuntimeError(f"device {i} refused: {refused}")
                if submitted:
                    pending.discard(i)
                    sent = True
            if not sent and not pending:
                time.sleep(0.02)  # the coordinator is decoding: the next round is not open yet
        return
    rng = np.random.default_rng(cfg.seed)
    silent = frozenset(int(i) for i in rng.choice(devices, round(cfg.dropout * devices), replace=False))
    from_rank = DROPOUT_STAGES.index(cfg.dropout_stage) + 1  # REGISTER is rank 0
    while (s := watch()).state not in (pb.DONE, pb.FAILED) and (later or s.state != pb.DECODING):
        if s.state == pb.DECODING:  # refinement rounds: the devices that did not drop out
            step_all(silent)
            time.sleep(0.02)
            continue
        rank = sw.STAGES.index(s.stage) if s.stage in sw.STAGES else len(sw.STAGES)
        step_all(silent if rank >= from_rank else ())
        if watch().stage == s.stage:
            time.sleep(0.05)  # waiting for the stage timeout (dropped devices)
