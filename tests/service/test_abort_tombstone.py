"""A device that signed the abort of round X keeps its session as a tombstone for good
(client/secure_abort.py): a coordinator that lists a new round under the same id X cannot have
that device join and reveal shares there while its old statement counts towards another device's
certificate of abort for X (review finding 1; before, the session was dropped once settled).
Since statement version 2 the statement also names the round's instance R (the SHA-256 of the
ADVERTISE_KEYS bundle), so it counts for nobody in a new round under X; the tombstone stays as
the first line. The round here fails at ADVERTISE_KEYS (two of four advertise, fewer than
t = 3): the two that received the bundle sign for its R."""

from __future__ import annotations

import numpy as np
from test_secagg_round import secure_spec
from test_secure_charges import run_until, stage

from fedsketch.client.secure_session import Session
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg.abort import bundle_digest


def test_a_device_that_signed_an_abort_keeps_a_tombstone_of_the_round(coordinator_round):
    r = coordinator_round
    x, _, _ = gmm(4_000, 3, 3, 3.0, seed=7)
    parts = np.array_split(x, 4)
    agents = [r.agent(f"g{i}", p, budget=1.0) for i, p in enumerate(parts)]
    study = r.create(secure_spec(4, epsilon=0.6, timeout=2.0)).study_id
    run_until(r, study, agents, lambda: stage(r, study) == pb.ADVERTISE_KEYS)  # all registered
    book = agents[0].ledger
    ident = book.identity()
    run_until(r, study, agents[:2], lambda: False)  # two advertise: fails at ADVERTISE_KEYS
    assert r.store.get_study(study).state == "failed"
    for _ in range(3):
        for a in agents[:2]:
            a.step()
    setup = Session.load(study, book.sessions()[study], ident).setup
    signed = {s.device_id: s.round_sha256 for s in r.store.abort_statements(study)}
    me = ident.device_id
    assert signed.get(me) == bundle_digest(setup)  # "I never reveal anything for round X, R"
    trace = (study in book.sessions(), book.find(study) is not None,
             any(j.study_id == study for j in book.joined()))
    assert trace[0], ("the device signed the abort of round X and keeps nothing of it "
                        f"(session, spend, reservation: {trace}): it would join a new round "
                        "listed under id X and reveal shares there, while its statement still "
                        "counts for X")
