"""A device that signed the abort of a secure round (rule B, docs/secure-aggregation.md) never
sends UNMASK shares for it: not when the coordinator (lying, or restored from a backup) shows
the round at UNMASK again, not after a restart, not once its session is gone. In-process
coordinator over TLS, real ledger files: the device is told the round failed while the real
round is at UNMASK (the coordinator refuses its statement, since the study did not fail), then
restarted and stepped with UNMASK open."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from test_secagg_round import secure_spec
from test_secure_charges import run_until, stage

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.client.secure_session import Session
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg.abort import sign_statement
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


def test_the_coordinator_keeps_only_valid_statements_of_a_failed_round(coordinator_round):
    """Device/SecAggAbort over TLS: a statement signed with another device's key or for another
    coordinator's name is refused (UNAUTHENTICATED), one that names no round instance (a
    version-1 statement) too (INVALID_ARGUMENT), so is one from an enrolled device outside
    the round's roster or of a round that has not ended (PERMISSION_DENIED); a roster device's
    is kept once, and handed back to every caller. The round fails at REGISTER (three of four
    register), which is the round a test can fail in-process at once."""
    r = coordinator_round
    x, _, _ = gmm(4_000, 3, 3, 3.0, seed=7)
    parts = np.array_split(x, 4)
    agents = [r.agent(f"f{i}", p, budget=1.0) for i, p in enumerate(parts)]
    stub = r.device_stub()
    ids = [a.ledger.identity() for a in agents]

    r_ = bytes(range(32))  # the round instance the statements name (the round never set up)

    def statement(study: str, who: int, key: int | None = None, to: str = "localhost"):
        signer = ids[who if key is None else key]
        return pb.AbortStatement(study_id=study, device_id=ids[who].device_id, audience=to,
                                 round_sha256=r_,
                                 signature=sign_statement(signer.private_key, to, study, r_,
                                                          ids[who].device_id))

    study = r.create(secure_spec(4, epsilon=0.6, timeout=2.0)).study_id
    with pytest.raises(grpc.RpcError) as running:
        stub.SecAggAbort(statement(study, 0))
    assert running.value.code() == grpc.StatusCode.PERMISSION_DENIED
    run_until(r, study, agents[:3], lambda: False)  # three of four register: fails at REGISTER
    assert r.store.get_study(study).state == "failed"
    v1 = statement(study, 0)
    v1.ClearField("round_sha256")
    for bad, code in ((v1, grpc.StatusCode.INVALID_ARGUMENT),  # version 1: no round instance
                      (statement(study, 0, key=1), grpc.StatusCode.UNAUTHENTICATED),
                      (statement(study, 0, to="elsewhere.example"), grpc.StatusCode.UNAUTHENTICATED),
                      (statement(study, 3), grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as refused:
            stub.SecAggAbort(bad)
        assert refused.value.code() == code, refused.value.details()
    # kept: only the roster devices' own statements (theirs may have come in already, from the
    # agents' last pass: each signs once it sees the study failed); Ed25519 is deterministic
    own = {ids[i].device_id: statement(study, i).signature for i in range(3)}
    for _ in range(2):
        reply = stub.SecAggAbort(statement(study, 1))
        assert ids[1].device_id in {s.device_id for s in reply.statements}
        assert all(own[s.device_id] == s.signature for s in reply.statements), reply
        assert len(reply.statements) == len({s.device_id for s in reply.statements})
    assert reply.final  # the round never opened: nobody spent, nothing more to collect
