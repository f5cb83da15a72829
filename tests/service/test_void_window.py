"""A void and a crash: a device that recorded its spend, then left the round and died just after
the void committed, must never send the voided bytes, even when a coordinator (lying, or restored
from a backup) shows MASKED_INPUT open again after the restart. Found by a reviewer, whose
reproduction this is: before the fix the session was saved as left only after the void, and the
re-send path sent a voided spend. In-process coordinator over TLS, real ledger files."""

from __future__ import annotations

import numpy as np
from test_secagg_round import secure_spec
from test_secure_charges import run_until, stage

import fedsketch.client.secure_steps as steps
from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.client.secure_session import Session
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.bench.metrics import split


class Killed(BaseException):
    """The process dies here (a BaseException: nothing on the way catches it)."""


def test_voided_bytes_never_leave_after_a_crash_in_the_void_window(coordinator_round, monkeypatch):
    r = coordinator_round
    x, _, _ = gmm(8_000, 3, 3, 3.0, seed=5)
    parts = np.array_split(x, 6)
    study = r.create(secure_spec(6, epsilon=0.6, dropouts=2, timeout=60.0)).study_id
    agents = [r.agent(f"w{i}", p, budget=1.0) for i, p in enumerate(parts)]
    run_until(r, study, agents, lambda: stage(r, study) == pb.MASKED_INPUT)
    data = LocalData(lambda: split(parts[0]), 3)

    def kill(where="kill-after-commit"):
        if where == "kill-after-commit":
            raise Killed
    monkeypatch.setattr(steps, "fault_point", kill)  # dies after the spend's commit, before y leaves
    try:
        agents[0].step()
    except Killed:
        pass
    monkeypatch.undo()
    book = Ledger(r.folder / "w0.ledger")
    assert book.find(study) is not None and book.find(study).acked_at is None
    ident = book.identity()
    session = Session.load(study, book.sessions()[study], ident)
    real_void = Ledger.void

    def void_then_die(self, *args, **kwargs):
        real_void(self, *args, **kwargs)
        raise Killed
    monkeypatch.setattr(Ledger, "void", void_then_die)
    try:  # restarted, the device leaves the round and dies just after the void commits
        Agent(r.channel(), book, lambda: data)._leave_session(study, session, "told to leave")
    except Killed:
        pass
    monkeypatch.undo()
    book = Ledger(r.folder / "w0.ledger")
    assert study in book.voids()
    again = Agent(r.channel(), book, lambda: data)  # restarted again: MASKED_INPUT is still open
    again.ensure_enrolled(r.target, "", "w0")
    again.step()
    sent = [m for m in r.store.stage_messages(study)
            if m.device_id == ident.device_id and m.stage == pb.MASKED_INPUT]
    assert sent == [], "voided bytes were sent"
    assert book.spent("default") == (0.0, 0.0)
