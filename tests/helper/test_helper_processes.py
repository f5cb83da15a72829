"""The helper as a real process (`fedsketch helper serve`, TLS, its SQLite file) and the
coordinator's validation against it (:mod:`fedsketch.server.helper.link`): honest reports are
summed exactly, hostile ones (an inflated input, uniform random words) are excluded, the
coordinator's calls need the helper token, and an acknowledged share survives a SIGKILL."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
from helperproc import Helper

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.validity import xof
from fedsketch.common.validity.sharing import proven
from fedsketch.server.helper.link import Report, validate
from fedsketch.server.sim.hostile import out_of_range

N, BOUND = 24, 5000
CIRCUIT = (N, BOUND, 0)


@pytest.fixture
def helper(tmp_path):
    h = Helper(tmp_path)
    yield h
    h.stop()


def upload(stub, study_id: str, kind: str, x: np.ndarray) -> Report:
    """A device's report of ``x`` (honest) or a hostile one: its helper share uploaded, its
    leader share returned as the coordinator holds it."""
    proof, nonce = proven(*CIRCUIT), xof.seed()
    if kind == "honest":
        leader, helper = proof.shard(x, nonce)
    elif kind == "inflate":  # 100 x an honest input: far beyond the bound
        leader, helper = proof.shard_encoded(out_of_range(proof.circuit, 100 * x), nonce)
    else:  # uniform random words
        leader, helper = proof.shard_encoded(xof.expand(xof.seed(), b"r", proof.circuit.length),
                                             nonce)
    ack = stub.Upload(pb.HelperUpload(study_id=study_id, nonce=nonce, seed=helper.seed,
                                      blind=helper.blind, peer_part=helper.peer_part), timeout=60)
    assert not ack.duplicate
    return Report(nonce, leader, CIRCUIT)


def test_valid_reports_are_summed_exactly_and_hostile_ones_excluded(helper):
    rng = np.random.default_rng(7)
    xs = rng.integers(-BOUND // 200, BOUND // 200 + 1, (5, N))
    device = helper.device()
    reports = [upload(device, "s1", "honest", x) for x in xs]
    hostile = [upload(device, "s1", "inflate", xs[0]), upload(device, "s1", "random", xs[0])]
    stub, meta = helper.coordinator()
    out = validate(stub, meta, "s1", reports + hostile, xof.seed(), min_reports=3)
    assert sorted(out.accepted) == sorted(r.nonce for r in reports)
    assert sorted(out.excluded) == sorted(r.nonce for r in hostile)
    assert out.total.tolist() == xs.sum(axis=0).tolist()


def test_the_coordinators_calls_need_the_helper_token_and_one_aggregate_is_answered(helper):
    device = helper.device()
    xs = np.arange(4 * N).reshape(4, N) - 2 * N
    reports = [upload(device, "s2", "honest", x) for x in xs]
    close = pb.HelperClose(study_id="s2", seed_commitment=bytes(32))
    for meta, code in (((), grpc.StatusCode.UNAUTHENTICATED),
                       ((("authorization", "Bearer wrong"),), grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as err:
            device.CloseCollection(close, metadata=meta, timeout=60)
        assert err.value.code() == code
    stub, meta = helper.coordinator()
    with pytest.raises(RuntimeError, match="4 valid reports, fewer than the study's L - D = 5"):
        validate(stub, meta, "s2", reports, seed := xof.seed(), min_reports=5)  # not even asked
    few = [upload(device, "s2-few", "honest", x) for x in xs[:2]]
    with pytest.raises(grpc.RpcError) as err:  # below the helper's --min-reports (3): no share
        validate(stub, meta, "s2-few", few, xof.seed(), min_reports=2)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    out = validate(stub, meta, "s2", reports, seed, min_reports=4)
    assert out.total.tolist() == xs.sum(axis=0).tolist()
    with pytest.raises(grpc.RpcError) as err:  # a second aggregate over fewer reports: refused
        validate(stub, meta, "s2", reports[:3], seed, min_reports=3)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as err:  # the seed committed to at the close, only
        validate(stub, meta, "s2", reports, xof.seed(), min_reports=4)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as err:  # collection closed
        upload(device, "s2", "honest", xs[0])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_an_acknowledged_share_survives_a_sigkill(helper):
    device = helper.device()
    xs = np.arange(3 * N).reshape(3, N)
    proof, nonce = proven(*CIRCUIT), xof.seed()
    leader, share = proof.shard(xs[0], nonce)
    upload_msg = pb.HelperUpload(study_id="s3", nonce=nonce, seed=share.seed, blind=share.blind,
                                 peer_part=share.peer_part)
    assert not device.Upload(upload_msg, timeout=60).duplicate
    reports = [Report(nonce, leader, CIRCUIT)] + [upload(device, "s3", "honest", x) for x in xs[1:]]
    helper.kill()
    helper.start()
    device = helper.device()
    assert device.Upload(upload_msg, timeout=60).duplicate  # kept: the same bytes acknowledged
    other = pb.HelperUpload(study_id="s3", nonce=nonce, seed=xof.seed(), blind=share.blind,
                            peer_part=share.peer_part)
    with pytest.raises(grpc.RpcError) as err:
        device.Upload(other, timeout=60)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    stub, meta = helper.coordinator()
    assert validate(stub, meta, "s3", reports, xof.seed(), 3).total.tolist() == xs.sum(0).tolist()
    assert os.stat(helper.folder / "helper.token").st_mode & 0o777 == 0o600


def test_unparseable_bytes_get_invalid_argument_naming_the_message(helper):
    """Every Helper method parses its raw bytes itself (the coordinator's handlers): bytes that
    are no protobuf (an over-long varint tag) get INVALID_ARGUMENT naming the expected message,
    with or without the coordinator's token, and the helper stays up."""
    from fedsketch.common.net.tls import secure_channel

    service = pb.DESCRIPTOR.services_by_name["Helper"]
    channel = secure_channel(helper.target, helper.ca)
    token = (helper.folder / "helper.token").read_text().strip()
    for method in service.methods:
        call = channel.unary_unary(f"/fedsketch.v1.Helper/{method.name}")
        for metadata in ((), (("authorization", f"Bearer {token}"),)):
            with pytest.raises(grpc.RpcError) as err:
                call(b"\xff" * 11, timeout=20, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method.name, err.value)
            assert f"not a well-formed {method.input_type.full_name} message" in err.value.details()
    assert helper.proc.poll() is None
