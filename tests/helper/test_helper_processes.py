"""The helper as a real process (`fedsketch helper serve`, TLS, its SQLite file) and the
coordinator's validation against it (:mod:`fedsketch.server.helper.link`): honest reports are
summed exactly, hostile ones (an inflated input, uniform random words) are excluded, the
coordinator's calls need the helper token, and an acknowledged share survives a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedsketch.common.net.tls import init_certs, secure_channel
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.validity import xof
from fedsketch.common.validity.circuit import RangeCircuit, width
from fedsketch.common.validity.field import P
from fedsketch.server.helper.link import Report, helper_stub, validate
from fedsketch.server.helper.service import proven

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
N, BOUND = 24, 5000
CIRCUIT = (N, BOUND, 0)


class Helper:
    """A `fedsketch helper serve` process on a free loopback port."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        if not (folder / "certs" / "ca.pem").exists():
            init_certs(folder / "certs", ["localhost", "127.0.0.1"])
        self.start()

    def start(self) -> None:
        port_file = self.folder / "port"
        port_file.unlink(missing_ok=True)
        certs = self.folder / "certs"
        self.proc = subprocess.Popen(
            [FEDSKETCH, "helper", "serve", "--db", str(self.folder / "helper.db"),
             "--listen", "127.0.0.1:0", "--cert", str(certs / "server.pem"),
             "--key", str(certs / "server.key"), "--token-file", str(self.folder / "helper.token"),
             "--port-file", str(port_file)], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120  # generous: a loaded machine starts Python slowly
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the helper did not start: {self.proc.stderr.read()}")
            time.sleep(0.05)
        self.target = f"localhost:{port_file.read_text().strip()}"

    @property
    def ca(self) -> Path:
        return self.folder / "certs" / "ca.pem"

    def device(self) -> pb_grpc.HelperStub:
        return pb_grpc.HelperStub(secure_channel(self.target, self.ca))

    def coordinator(self):
        return helper_stub(self.target, self.ca, (self.folder / "helper.token").read_text().strip())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc.stderr.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc.stderr.close()


@pytest.fixture
def helper(tmp_path):
    h = Helper(tmp_path)
    yield h
    h.stop()


def inflated(circ: RangeCircuit, x: np.ndarray) -> np.ndarray:
    """A hostile encoding of x with entries beyond ±B: y_i = x_i + B in valid bits (mod 2^w)
    and z_i = 2B − y_i as one field element, so that y_i + z_i = 2B holds and only the check
    that every element is a bit fails."""
    w = width(circ.bound)
    y = (x + circ.bound) % (1 << w)
    encoded = np.zeros(circ.length, dtype=np.int64)
    encoded[: circ.n * w] = ((y[:, None] >> np.arange(w)) & 1).ravel()
    encoded[circ.n * w:: w][: circ.n] = np.mod(2 * circ.bound - y, P)
    return encoded


def upload(stub, study_id: str, kind: str, x: np.ndarray) -> Report:
    """A device's report of ``x`` (honest) or a hostile one: its helper share uploaded, its
    leader share returned as the coordinator holds it."""
    proof, nonce = proven(*CIRCUIT), xof.seed()
    if kind == "honest":
        leader, helper = proof.shard(x, nonce)
    elif kind == "inflate":  # 100 x an honest input: far beyond the bound
        leader, helper = proof.shard_encoded(inflated(proof.circuit, 100 * x), nonce)
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
    with pytest.raises(grpc.RpcError) as err:  # below the minimum: no share answered
        validate(stub, meta, "s2", reports, seed := xof.seed(), min_reports=5)
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
