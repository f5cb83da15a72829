"""A device that signed the abort of a secure round (rule B, docs/secure-aggregation.md) never
sends UNMASK shares for it: not when the coordinator (lying, or restored from a backup) shows
the round at UNMASK again, not after a restart, not once its session is gone. In-process
coordinator over TLS, real ledger files: the device is told the round failed while the real
round is at UNMASK (the coordinator refuses its statement, since the study did not fail), then
restarted and stepped with UNMASK open."""

from __future__ import annotations

import numpy as np
from test_secagg_round import secure_spec
from test_secure_charges import run_until, stage

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.client.secure_session import Session
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.bench.metrics import split


def test_a_device_that_signed_the_abort_never_unmasks(coordinator_round):
    r = coordinator_round
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=6)
    parts = np.array_split(x, 4)
    study = r.create(secure_spec(4, epsilon=0.6, timeout=60.0)).study_id
    agents = [r.agent(f"a{i}", p, budget=1.0) for i, p in enumerate(parts)]
    run_until(r, study, agents, lambda: stage(r, study) == pb.UNMASK)
    book = agents[0].ledger
    ident = book.identity()
    assert pb.UNMASK not in Session.load(study, book.sessions()[study], ident).replies
    # told "FAILED": it records the abort and erases its shares before the statement leaves
    assert agents[0]._abort_settled(ident, study, book.sessions()[study])
    kept = Session.load(study, book.sessions()[study], ident)
    assert kept.aborted and kept.left and kept.client is None and kept.input is None
    path = book.path
    book.close()
    data = LocalData(lambda: split(parts[0]), 3)

    def unmasked() -> list:
        return [m for m in r.store.stage_messages(study, (pb.UNMASK,))
                if m.device_id == ident.device_id]

    for drop in (False, True):  # restarted, with its session and then without it
        again = Agent(r.channel(), Ledger(path), lambda: data)
        again.ensure_enrolled(r.target, "", "a0")
        if drop:
            again.ledger.drop_session(study, "default")
        for _ in range(3):
            assert stage(r, study) == pb.UNMASK
            again.step()
        assert unmasked() == [], "a device that signed the abort sent UNMASK shares"
        again.ledger.close()
    agents[1].step()  # a device that did not sign still unmasks: the round itself is served
    assert [m.device_id for m in r.store.stage_messages(study, (pb.UNMASK,))] == \
        [agents[1].ledger.identity().device_id]
