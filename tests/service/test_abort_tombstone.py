"""An abort statement names the coordinator, the study id and the signer, not the round's
instance; so a device that signed the abort of round X keeps its session as a tombstone for good
(client/secure_abort.py): a coordinator that lists a new round under the same id X cannot have
that device join and reveal shares there while its old statement counts towards another device's
certificate of abort for X (review finding; before, the session was dropped once settled)."""

from __future__ import annotations

import numpy as np
from test_secagg_round import secure_spec
from test_secure_charges import run_until

from fedsketch.common.data.synthetic import gmm


def test_a_device_that_signed_an_abort_keeps_a_tombstone_of_the_round(coordinator_round):
    r = coordinator_round
    x, _, _ = gmm(4_000, 3, 3, 3.0, seed=7)
    parts = np.array_split(x, 4)
    agents = [r.agent(f"g{i}", p, budget=1.0) for i, p in enumerate(parts)]
    study = r.create(secure_spec(4, epsilon=0.6, timeout=2.0)).study_id
    run_until(r, study, agents[:3], lambda: False)  # three of four register: fails at REGISTER
    assert r.store.get_study(study).state == "failed"
    for _ in range(3):
        for a in agents[:3]:
            a.step()
    signed = {s.device_id for s in r.store.abort_statements(study)}
    me = agents[0].ledger.identity().device_id
    assert me in signed  # the device signed "I never reveal anything for round X"
    book = agents[0].ledger
    trace = (study in book.sessions(), book.find(study) is not None,
             any(j.study_id == study for j in book.joined()))
    assert trace[0], ("the device signed the abort of round X and keeps nothing of it "
                        f"(session, spend, reservation: {trace}): it would join a new round "
                        "listed under id X and reveal shares there, while its statement still "
                        "counts for X")
