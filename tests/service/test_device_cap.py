"""The per-device record cap (``StudySpec.max_device_records``, issue 12 findings 2 and 3), over
gRPC against a real coordinator (TLS on loopback, SQLite): a hostile device cannot dictate,
fail or abort a study through the count it declares, and an honest device with more records
than the cap refuses the study before it spends."""

from __future__ import annotations

from dataclasses import replace

import grpc
import numpy as np
import pytest
from conftest import META, contribute_all, study_spec
from test_secagg_round import drive, secure_spec

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.net import signing
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.spec import release_sketch
from fedsketch.common.study import wire
from fedsketch.common.study.payload import count_radius
from fedsketch.common.study.study import DEFAULT_MAX_DEVICE_RECORDS, StudySpec
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n

CAP = 5_000


@pytest.fixture(scope="module")
def parts():
    x, _, _ = gmm(12_000, 3, 3, 3.0, seed=12)
    return np.array_split(x, 4)  # 3,000 records each


def test_the_cap_is_part_of_the_hashed_spec_and_old_specs_hash_as_before():
    spec = study_spec()
    assert spec.max_device_records == spec.device_cap == DEFAULT_MAX_DEVICE_RECORDS
    assert StudySpec.from_json(spec.to_json()) == spec
    assert study_spec(max_device_records=CAP).sha256() != spec.sha256()
    old = StudySpec.from_json(spec.to_json().replace(f',"max_device_records":{spec.device_cap}', ""))
    assert old.max_device_records is None and old.device_cap == wire.MAX_RECORDS
    assert "max_device_records" not in old.to_json()  # a stored study reads and hashes as before
    with pytest.raises(ValueError, match="declares max_device_records"):
        old.check_new()
    for bad in (0, 2.5, True, "9", wire.MAX_RECORDS + 1):
        with pytest.raises(ValueError, match="max_device_records must be an integer"):
            study_spec(max_device_records=bad)
    with pytest.raises(ValueError, match="max_device_records must be an integer"):
        study_spec(min_records=10, max_device_records=9)
    secure = secure_spec(3, max_records=10_000)
    assert secure.device_cap == 10_000  # the default is at most the secure total
    with pytest.raises(ValueError, match="at most the total max_records"):
        replace(secure, max_device_records=10_001)


def _signed(agent, study: pb.Study, n: float, kind: str, payload: bytes) -> pb.Contribution:
    identity = agent.ledger.identity()
    digest = signing.contribution_digest(study.study_id, identity.device_id, n, study.spec_sha256,
                                         payload)
    return pb.Contribution(study_id=study.study_id, device_id=identity.device_id,
                           spec_sha256=study.spec_sha256, n=n,
                           signature=signing.sign(identity.private_key, digest), **{kind: payload})


@pytest.mark.parametrize("neighbouring", ["replace_one", "add_remove"])
def test_a_hostile_count_is_refused_and_the_study_completes_from_the_honest(
        coordinator_round, parts, neighbouring):
    """A roster device sends a sketch of its real records (entries in range) with a count of
    1e300, 1e308, −1e308, 10.5 or beyond the cap: each is refused with INVALID_ARGUMENT and
    stores nothing (1e300 used to make its sketch the result; 1e308 and −1e308 failed the
    study), and the study decodes from the three honest devices alone."""
    r = coordinator_round
    spec = study_spec(min_devices=3, roster=4, collect_seconds=600.0, max_device_records=CAP,
                      neighbouring=neighbouring)
    study = r.create(spec)
    honest = [r.agent(f"h{i}", parts[i]) for i in range(3)]
    hostile = r.agent("hostile", parts[3])
    assert not isinstance(hostile._register(hostile.ledger.identity(), study), str)  # on the roster
    contribute_all(honest, study.study_id)
    release = release_sketch(spec.sketch, split(parts[3]), Box(spec.lo, spec.hi))
    kind, payload = wire.encode(release, spec.sketch.feature)
    above = CAP + 1 if neighbouring == "replace_one" else CAP + count_radius(spec) + 2
    for n in (1e300, 1e308, -1e308, 10.5, float(above)):
        with pytest.raises(grpc.RpcError) as err:
            hostile.stub.Submit(_signed(hostile, study, n, kind, payload), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, n
        assert "record count" in err.value.details()
    assert len(r.store.contributions(study.study_id)) == 3
    r.operator().CloseStudy(pb.StudyRef(study_id=study.study_id), metadata=META)
    s = r.wait(study.study_id)
    assert s.state == pb.DONE, s.detail
    assert s.contributions == 3
    honest_x = np.concatenate(parts[:3])
    if neighbouring == "replace_one":
        assert s.records == honest_x.shape[0]
    res = r.result(study.study_id)
    centroids = np.asarray(res.centroids).reshape(res.k, res.d)
    ref = sse_per_n(split(honest_x), sklearn_kmeans_centroids(honest_x, 3))
    assert sse_per_n(split(honest_x), centroids) / ref < 1.15


def test_a_hostile_register_is_refused_alone_and_the_secure_round_completes(coordinator_round,
                                                                            parts):
    """Secure aggregation of three devices, max_records 10,000 in all and 5,000 per device: a
    fourth device's REGISTER bodies that are too large, carry other keys, or declare a count
    that is not an integer, beyond the cap, or that would bring the total over max_records
    (after two honest devices registered 6,000) are each refused with INVALID_ARGUMENT and held
    nowhere; the honest three complete the round (such a REGISTER used to be accepted and abort
    it for everyone)."""
    r = coordinator_round
    spec = replace(secure_spec(3, max_records=10_000, timeout=60), max_device_records=CAP)
    study = r.create(spec)
    honest = [r.agent(f"s{i}", parts[i]) for i in range(3)]
    hostile = r.agent("hostile-s", parts[3])
    ident = hostile.ledger.identity()

    def refused(body: bytes, words: str) -> None:
        digest = sw.message_digest(study.study_id, ident.device_id, pb.REGISTER, body)
        msg = pb.SecAggMessage(study_id=study.study_id, device_id=ident.device_id,
                               stage=pb.REGISTER, body=body,
                               signature=signing.sign(ident.private_key, digest))
        with pytest.raises(grpc.RpcError) as err:
            hostile.stub.SecAggSend(msg, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, body[:40]
        assert words in err.value.details(), err.value.details()

    refused(b'{"n":3000,"pad":"' + b"x" * 1_000_000 + b'"}', "at most 64 bytes")
    refused(b'{"n":3000,"role":"admin"}', "exactly")
    refused(b'{"records":3000}', "exactly")
    refused(b"[3000]", "exactly")
    for n in (b"1e300", b"1e308", b"-1e308", b"3000.5"):
        refused(b'{"n":' + n + b"}", "must be an integer")
    refused(b'{"n":0}', "outside 1 .. 5,000")
    refused(b'{"n":5001}', "outside 1 .. 5,000")
    refused(b'{"n":1099511627777}', "outside 1 .. 5,000")
    for agent in honest[:2]:
        agent.step()  # prepares its input
        agent.step()  # registers
    rnd = r.coordinator.rounds[study.study_id]
    assert len(rnd._inbox[pb.REGISTER]) == 2
    refused(b'{"n":4500}', "above the study's max_records 10,000")
    s = drive(r, study.study_id, honest)
    assert s.state == pb.DONE, s.detail
    res = r.result(study.study_id)
    assert res.records == 9_000 and res.devices == 3
    assert rnd._params is None or ident.device_id not in rnd._params.device_ids
    for agent in honest:
        assert len(agent.ledger.spends()) == 1


def test_a_device_whose_count_would_pass_the_secure_total_is_refused_alone(coordinator_round,
                                                                           parts):
    """L = 4 devices of 3,000 records, one dropout allowed, max_records 10,000: the fourth to
    register is refused (INVALID_ARGUMENT) with the reason, spends nothing, and the round goes
    on with the other three once REGISTER times out."""
    r = coordinator_round
    study = r.create(secure_spec(4, dropouts=1, max_records=10_000))
    agents = [r.agent(f"t{i}", parts[i]) for i in range(4)]
    for agent in agents:
        agent.step()  # prepares its input
    outcomes = [agent.step() for agent in agents]  # registers
    reason = outcomes[3].refused[study.study_id]
    assert "above the study's max_records 10,000" in reason, reason
    s = drive(r, study.study_id, agents[:3])
    assert s.state == pb.DONE, s.detail
    res = r.result(study.study_id)
    assert res.records == 9_000 and res.devices == 3
    assert agents[3].ledger.spends() == [] and all(len(a.ledger.spends()) == 1 for a in agents[:3])


@pytest.mark.parametrize("kind", ["replace_one", "add_remove", "secure"])
def test_a_device_with_more_records_than_the_cap_refuses_and_spends_nothing(coordinator_round,
                                                                            parts, kind):
    """Its reason names the cap; its ledger holds no spend and no reservation, and it never
    joined the roster (plain) or registered (secure)."""
    r = coordinator_round
    if kind == "secure":
        spec = replace(secure_spec(3, max_records=10_000), max_device_records=2_999)
    else:
        spec = study_spec(min_devices=2, max_device_records=2_999, neighbouring=kind)
    study = r.create(spec)
    agent = r.agent(f"big-{kind}", parts[0], budget=2000.0)  # 3,000 records
    before = agent.ledger.remaining(agent.source)
    reason = agent.step().refused[study.study_id]
    assert "at most 2,999 records per device" in reason and "the device has more" in reason
    assert agent.ledger.spends() == [] and agent.ledger.reservations() == []
    assert agent.ledger.remaining(agent.source) == before
    # the coordinator learns the code alone (no count), once, in any relation
    agent.step()
    assert [(f.device_id, f.reason) for f in r.store.refusals(study.study_id, 10)[0]] == [
        (agent.ledger.identity().device_id, "too_many_records")]
    assert "3,000" not in str(r.store.audit_log(1000))
    row = r.store.get_study(study.study_id)
    assert row.registered == 0 and row.contributions == 0
    if kind == "secure":
        assert r.coordinator.rounds[study.study_id]._inbox[pb.REGISTER] == {}
