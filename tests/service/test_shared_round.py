"""Two coordinators' copies of one secure round (:class:`SharedRound`, each on a store of its own
over one PostgreSQL database, as two ``serve --shared`` processes hold it) check every message
against the round the database holds, not against what each copy saw: twice the quorum of
devices registering at once through both copies leaves exactly the quorum in the round, which
both copies then route alike, and a message re-sent through the other copy is acknowledged
again. The same with real processes and a SIGKILL: ``test_secure_shared.py``."""

from __future__ import annotations

import threading

from test_secagg_round import secure_spec

from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.study.study import spec_sha256
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.shared_round import SharedRound
from fedsketch.server.store import open_store

QUORUM = 6


def test_two_copies_of_a_round_admit_exactly_its_quorum_and_route_alike(postgres_url):
    stores = [open_store(postgres_url) for _ in range(2)]
    try:
        first = stores[0]
        first.add_tokens([f"t{i}" for i in range(2 * QUORUM)])
        devices = [first.enroll(f"t{i}", signing.public_key(signing.new_private_key()), f"d{i}")
                   for i in range(2 * QUORUM)]
        spec = secure_spec(QUORUM, timeout=60.0)
        text = spec.to_json()
        first.create_study("s", text, spec_sha256(text), None, QUORUM)
        copies = [SharedRound("s", spec, s, lambda *_: None, lambda _: None) for s in stores]
        start, answers = threading.Barrier(2 * QUORUM), {}

        def register(i: int) -> None:
            start.wait()
            try:
                answers[devices[i]] = copies[i % 2].receive(devices[i], pb.REGISTER, sw.register_body(500))
            except Refusal as exc:
                answers[devices[i]] = exc.code
        threads = [threading.Thread(target=register, args=(i,)) for i in range(2 * QUORUM)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        roster = {m.device_id for m in first.stage_messages("s")}
        assert len(roster) == QUORUM and first.secure_round("s").stage == pb.ADVERTISE_KEYS
        assert {u: a for u, a in answers.items() if u in roster} == dict.fromkeys(roster, False)
        assert {a for u, a in answers.items() if u not in roster} == {Code.FAILED_PRECONDITION}
        assert [set(c.members()) for c in copies] == [roster, roster]
        member = sorted(roster)[0]
        assert copies[0].fetch(member, pb.ADVERTISE_KEYS) == copies[1].fetch(member, pb.ADVERTISE_KEYS)
        assert copies[1 - devices.index(member) % 2].receive(member, pb.REGISTER,
                                                             sw.register_body(500)) is True
    finally:
        for s in stores:
            s.close()
