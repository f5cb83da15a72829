"""A device on a roster it joined, in the cases a reviewer found broken (issue 10, roster
findings C-E): a leave that fails now is tried again, a round's reservation is not counted
twice, a far deadline does not hold the budget for ever, another source's daemon does not pull
the device out of a study, a crash between registering and reserving still leaves on a
refusal, a secure session sets its whole study aside, and a coordinator without Leave does not
stall the device. Real coordinator over TLS on loopback, real ledgers."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from conftest import signed, study_spec
from typer.testing import CliRunner

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import DEFAULT_SOURCE, Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.client.policy import Policy
from fedsketch.common.study.refine import RefineSpec, is_round
from fedsketch.server.bench.metrics import split
from fedsketch.server.cli.main import app

DAY = 86400.0


class Transient(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection reset (injected)"


@pytest.fixture
def records() -> np.ndarray:
    return np.random.default_rng(4).uniform(-5.0, 5.0, size=(300, 3))


def device(rnd, ledger, x, token=None, source=DEFAULT_SOURCE) -> Agent:
    data = LocalData(lambda: split(x), x.shape[1])
    agent = Agent(rnd.channel(), ledger, lambda: data, source)
    agent.ensure_enrolled(rnd.target, token, "device")
    return agent


def on_roster(rnd, study_id) -> int:
    return rnd.store.get_study(study_id).registered


# ---- F1: a transient error on Leave after a final refusal: tried again on the next pass --------

def test_a_leave_that_fails_now_is_tried_again(coordinator_round, records, tmp_path):
    r = coordinator_round
    study = r.create(study_spec(epsilon=0.5, min_devices=2, roster=3, collect_seconds=600.0))
    book = Ledger.create(tmp_path / "v.ledger", 1.0)
    agent = device(r, book, records, r.tokens(1)[0])
    assert agent.step().registered == [study.study_id]
    book.set_policy(Policy(max_epsilon=0.1))          # the owner changes their mind
    assert r.agent("other", records).step().submitted == [study.study_id]   # quorum: input opens
    real_leave = agent.stub.Leave
    agent.stub.Leave = lambda *a, **k: (_ for _ in ()).throw(Transient())
    assert "at most 0.1" in agent.step().refused[study.study_id]  # the pass goes on
    assert on_roster(r, study.study_id) == 2 and book.reserved(DEFAULT_SOURCE) == (0.5, 0.0)
    agent.stub.Leave = real_leave                     # the network is back
    for _ in range(3):
        agent.step()
    problems = []
    if on_roster(r, study.study_id) != 1:
        problems.append(f"still on the roster ({on_roster(r, study.study_id)} registered)")
    if book.reserved(DEFAULT_SOURCE) != (0.0, 0.0):
        problems.append(f"budget still set aside: {book.reserved(DEFAULT_SOURCE)}")
    assert not problems, problems


# ---- F2: refinement round reservation counted twice (also in `promised`) -> wrong Leave ---------

def test_a_round_reservation_is_not_counted_twice(coordinator_round, records, tmp_path):
    """Budget 1. Study 'aay' (sketch 0.2, rounds 0.2 + 0.2), study 'bee' 0.4: 0.2 + 0.4 + 0.4 = 1
    fits. The device pays aay's sketch, joins bee, then joins round 1 of aay (its roster not full
    yet). When bee fills, the device must contribute to it."""
    r = coordinator_round
    aay = r.create(study_spec(epsilon=0.2, min_devices=2, name="aay",
                              refine=RefineSpec((0.2, 0.2), 600.0)))
    book = Ledger.create(tmp_path / "v.ledger", 1.0)
    victim = device(r, book, records, r.tokens(1)[0])
    helper = r.agent("helper", records)
    helper.ledger.set_policy(Policy(studies=("zzz",)))
    assert victim.step().registered == [aay.study_id]
    helper.ledger.set_policy(Policy())
    assert helper.step().submitted == [aay.study_id]
    helper.ledger.set_policy(Policy(studies=("zzz",)))   # the helper stays out of the rounds
    assert victim.step().submitted == [aay.study_id]
    bee = r.create(study_spec(epsilon=0.4, min_devices=2, name="bee"))
    stop = time.monotonic() + 120
    round1 = None
    while round1 is None:
        assert time.monotonic() < stop, "round 1 never opened"
        out = victim.step()
        assert bee.study_id not in out.refused, out.refused
        round1 = next((s.study_id for s in victim.stub.ListStudies(signed(victim, "ListStudies")).studies
                       if is_round(s.spec_json)), None)
        time.sleep(0.1)
    victim.step()
    assert book.reservation(bee.study_id) is not None
    assert book.reservation(round1) is not None and on_roster(r, round1) == 1
    filler = r.agent("filler", records)
    filler.ledger.set_policy(Policy(studies=("bee",)))
    assert filler.step().submitted == [bee.study_id]
    out = victim.step()
    assert bee.study_id in out.submitted, out.refused


# ---- F3: a far deadline makes a reservation permanent, and `device budget` crash ----------------

def test_a_far_deadline_holds_the_budget_for_ever_and_breaks_device_budget(coordinator_round,
                                                                          records, tmp_path):
    r = coordinator_round
    study = r.create(study_spec(epsilon=0.6, min_devices=2, deadline=1e20))
    path = tmp_path / "v.ledger"
    book = Ledger.create(path, 1.0)
    agent = device(r, book, records, r.tokens(1)[0])
    assert agent.step().registered == [study.study_id]
    held = book.reservation(study.study_id)
    problems = []
    if book.reserved(DEFAULT_SOURCE, now=time.time() + 365 * DAY) != (0.0, 0.0):
        problems.append(f"reservation expires at {held.expires_at:g}: a year later still held")
    book.close()
    shown = CliRunner().invoke(app, ["device", "budget", "--ledger", str(path)],
                               env={"COLUMNS": "250"})
    if shown.exit_code != 0:
        problems.append(f"device budget: exit {shown.exit_code}: {shown.exception!r}")
    assert not problems, problems


# ---- F4: a daemon of another source on the same ledger makes the device leave ------------------

def test_another_sources_daemon_does_not_pull_the_device_out_of_a_study(coordinator_round, records,
                                                                       tmp_path):
    """README: data about other people -> `device add-source NAME` and run it with `--source
    NAME` (a second daemon, same ledger, same device identity). Its file has d = 5."""
    r = coordinator_round
    path = tmp_path / "v.ledger"
    book_a = Ledger.create(path, 1.0)
    book_a.declare("clinic-b", 1.0)
    a = device(r, book_a, records, r.tokens(1)[0])
    b = device(r, Ledger(path), np.zeros((50, 5)), source="clinic-b")
    study = r.create(study_spec(epsilon=0.5, min_devices=2))
    assert a.step().registered == [study.study_id]
    assert "the data has 5" in b.step().refused[study.study_id]  # b's own: no leave for a's
    assert on_roster(r, study.study_id) == 1
    assert r.agent("other", records).step().submitted == [study.study_id]
    b.step()
    out = a.step()
    assert study.study_id in out.submitted, (out, book_a.reservation(study.study_id),
                                             on_roster(r, study.study_id))


# ---- F6: a crash between the reservation and Register: the device still joins, and leaves ------

def test_a_crash_between_reserving_and_registering_still_joins_and_leaves(coordinator_round, records,
                                                                      tmp_path):
    r = coordinator_round
    study = r.create(study_spec(epsilon=0.5, min_devices=2))
    path = tmp_path / "v.ledger"
    book = Ledger.create(path, 1.0)
    agent = device(r, book, records, r.tokens(1)[0])
    def killed(*a, **k):
        raise SystemExit("SIGKILL here (after the reservation commit, before Register)")
    agent._register = killed
    with pytest.raises(SystemExit):
        agent.step()
    book.close()
    assert on_roster(r, study.study_id) == 0
    book = Ledger(path)                                # restart: it confirms its place
    agent = device(r, book, records)
    assert agent.step().refused == {} and on_roster(r, study.study_id) == 1
    book.set_policy(Policy(max_epsilon=0.1))           # the owner tightens the policy
    assert r.agent("other", records).step().submitted == [study.study_id]
    out = agent.step()
    assert "at most 0.1" in out.refused[study.study_id]
    assert on_roster(r, study.study_id) == 1, "refused the study but stays on its roster"


# ---- F7: a secure study's session sets aside its sketch's ε only, not its rounds' --------------

def test_a_secure_session_sets_its_whole_study_aside(coordinator_round, records, tmp_path):
    from fedsketch.common.secagg.spec import SecAggSpec
    from fedsketch.common.secagg.trust import Assumptions
    r = coordinator_round
    sa = SecAggSpec.assuming(Assumptions(4, 0, 0), 100_000, None, 5.0)
    secure = r.create(study_spec(epsilon=0.2, min_devices=4, secure_aggregation=sa,
                                 refine=RefineSpec((0.3, 0.3)), name="secure"))
    book = Ledger.create(tmp_path / "v.ledger", 1.0)
    agent = device(r, book, records, r.tokens(1)[0])
    assert agent.step().refused == {} and secure.study_id in agent._sessions   # joined: 0.8 in all
    plain = r.create(study_spec(epsilon=0.5, min_devices=2, name="plain"))
    out = agent.step()
    assert plain.study_id in out.refused, (
        f"joined a 0.5 study on a budget of 1 while in a study of 0.8: {out}")


# ---- F1b: a Leave the coordinator does not implement (a coordinator before 5ec8cab) -------------

class Unimplemented(Transient):
    def code(self):
        return grpc.StatusCode.UNIMPLEMENTED


def test_a_leave_that_always_fails_does_not_stall_every_other_study(coordinator_round, records,
                                                                    tmp_path):
    r = coordinator_round
    joined = r.create(study_spec(epsilon=0.5, min_devices=2, name="joined"))
    book = Ledger.create(tmp_path / "v.ledger", 1.0)
    agent = device(r, book, records, r.tokens(1)[0])
    agent.stub.Leave = lambda *a, **k: (_ for _ in ()).throw(Unimplemented())
    assert agent.step().registered == [joined.study_id]
    book.lower(DEFAULT_SOURCE, 0.4)                         # the owner lowers the budget
    assert r.agent("other", records).step().submitted == [joined.study_id]
    later = r.create(study_spec(epsilon=0.1, min_devices=1, name="later"))
    errors = 0
    for _ in range(3):
        try:
            agent.step()
        except grpc.RpcError:
            errors += 1
    assert [s.study_id for s in book.spends()] == [later.study_id], (
        f"{errors} of 3 passes raised; the later study was never handled")
