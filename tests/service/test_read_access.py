"""Who reads what (issue 12, finding 9): a device reads, with a fresh read signed by its enrolled
key, the studies it may join and the results of the studies it contributed to; nobody reads
without a credential; an unknown study looks like a forbidden one; a refused read changes
nothing. Real coordinator over TLS on loopback, real SQLite store, real agents. (The operator's
reads without or with a wrong token: ``test_round.test_operator_calls_need_the_credential``.)"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from conftest import META, Round, signed, study_spec
from test_fuzz_api import tables
from test_refine_rounds import plant_round, refined_spec

from fedsketch.client.agent import Agent
from fedsketch.common.net import signing
from fedsketch.common.net.device_reads import signed_read
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.service.reads import READ_WINDOW_SECONDS

READS = ("ListStudies", "GetStudy", "GetResult")
UNKNOWN = "st-0123456789abcdef"


@dataclass
class World:
    """A done study whose one device (``member``) contributed, an open study nobody joined, and
    an enrolled ``outsider`` that took part in nothing."""

    r: Round
    member: Agent
    outsider: Agent
    done: str
    open: str

    def call(self, method: str, request: pb.DeviceRead, **kw):
        return getattr(self.r.device_stub(), method)(request, timeout=20, **kw)

    def refused(self, method: str, request: pb.DeviceRead, code: grpc.StatusCode, **kw) -> str:
        """The details of the refusal of ``request``, which must have status ``code``."""
        with pytest.raises(grpc.RpcError) as err:
            self.call(method, request, **kw)
        assert err.value.code() == code, err.value.details()
        return err.value.details()


@pytest.fixture
def world(coordinator_round) -> World:
    r = coordinator_round
    x = np.random.default_rng(5).uniform(-5.0, 5.0, size=(400, 3))
    done = r.create(study_spec(min_devices=1)).study_id
    member = r.agent("member", x)
    assert member.step().submitted == [done]
    assert r.wait(done).state == pb.DONE
    opened = r.create(study_spec(min_devices=2, name="open")).study_id
    return World(r, member, r.agent("outsider", x), done, opened)


@pytest.fixture
def unchanged(world):
    """The test leaves every table of the store as it found it."""
    before = tables(world.r.folder / "coordinator.db")
    yield
    assert tables(world.r.folder / "coordinator.db") == before


def _ids(response: pb.ListStudiesResponse) -> list[str]:
    return [s.study_id for s in response.studies]


def test_a_read_without_a_device_signature_is_unauthenticated(world, unchanged):
    """Nothing but a device's signature opens the Device reads: not an empty request, not the
    operator's token (the operator reads through its own service)."""
    for method in READS:
        sid = "" if method == "ListStudies" else world.done
        for meta in (None, META):
            why = world.refused(method, pb.DeviceRead(study_id=sid), grpc.StatusCode.UNAUTHENTICATED,
                                metadata=meta)
            assert f"Device/{method} needs a read signed by an enrolled device" in why
            assert "the operator reads with its token through the Operator service" in why


def test_unknown_unenrolled_and_forged_reads_get_one_answer(world, unchanged):
    """No enrollment oracle: an unknown device id, a device that signs properly but is not
    enrolled here, an enrolled device's id under another key's signature, and under a signature
    of the wrong length are refused alike (same code, same words)."""
    target, member = world.r.target, world.member.ledger.identity().device_id
    for method in READS:
        sid = "" if method == "ListStudies" else world.done
        stranger_key = signing.new_private_key()
        forged = signed(world.outsider, method, sid)
        forged.device_id = member
        short = signed(world.member, method, sid)
        short.signature = short.signature[:-1]
        reads = [signed_read(stranger_key, "no such device", target, method, sid),
                 signed_read(stranger_key, "dev-0000000000000000", target, method, sid), forged, short]
        answers = {world.refused(method, read, grpc.StatusCode.UNAUTHENTICATED) for read in reads}
        assert len(answers) == 1, answers
        assert "does not verify" in answers.pop()


def test_a_device_reads_what_it_may_and_nothing_else(world, unchanged):
    member, outsider = world.member, world.outsider
    mine = world.call("GetResult", signed(member, "GetResult", world.done))
    assert mine == world.r.result(world.done) and mine.devices == 1
    assert world.call("GetStudy", signed(member, "GetStudy", world.done)).state == pb.DONE
    assert world.call("GetStudy", signed(outsider, "GetStudy", world.open)).state == pb.OPEN
    assert _ids(world.call("ListStudies", signed(outsider, "ListStudies"))) == [world.open]
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert "reads the open studies" in world.refused(
        "GetResult", signed(outsider, "GetResult", world.done), denied)
    world.refused("GetResult", signed(member, "GetResult", world.open), denied)  # not contributed
    world.refused("GetStudy", signed(outsider, "GetStudy", world.done), denied)  # closed, not in it
    for method in ("GetStudy", "GetResult"):  # no oracle: unknown reads as forbidden
        known = world.refused(method, signed(outsider, method, world.done), denied)
        unknown = world.refused(method, signed(outsider, method, UNKNOWN), denied)
        assert unknown == known.replace(world.done, UNKNOWN)
    assert "names no study" in world.refused(
        "ListStudies", signed(member, "ListStudies", world.open), grpc.StatusCode.INVALID_ARGUMENT)


def test_a_stale_or_rebound_signature_is_refused(world, unchanged):
    """A read is good for its method, device and study within the window: replayed then, it
    reads again what that device may read anyway; moved in time, to another study or method,
    or signed by another key, it is refused."""
    member, now = world.member, time.time()
    fresh = signed(member, "GetResult", world.done)
    assert world.call("GetResult", fresh) == world.call("GetResult", fresh)  # a replay in the window
    unauth = grpc.StatusCode.UNAUTHENTICATED
    for at in (now - READ_WINDOW_SECONDS - 5, now + READ_WINDOW_SECONDS + 5, math.nan, math.inf):
        assert "sign it afresh" in world.refused("GetResult", signed(member, "GetResult", world.done,
                                                                    at), unauth)
    rebound = pb.DeviceRead()
    rebound.CopyFrom(fresh)
    rebound.study_id = world.open
    assert "does not verify" in world.refused("GetResult", rebound, unauth)
    assert "does not verify" in world.refused("GetStudy", fresh, unauth)


def test_a_read_signed_for_another_coordinator_is_refused(world, unchanged):
    """A read is signed for the coordinator the device reached (the name in its --coordinator,
    which this coordinator's certificate names: localhost and 127.0.0.1); one the device signed
    for another coordinator, replayed here, is refused, whether it says so or claims this one.
    A read of an older device (format 0, no audience) is told to update."""
    identity, unauth = world.member.ledger.identity(), grpc.StatusCode.UNAUTHENTICATED
    port = world.r.target.rpartition(":")[2]
    for name in ("127.0.0.1", "LocalHost."):  # each name of the certificate, in any spelling
        read = signed_read(identity.private_key, identity.device_id, f"{name}:{port}", "GetResult",
                           world.done)
        assert world.call("GetResult", read).devices == 1
    elsewhere = signed_read(identity.private_key, identity.device_id, "coord-b.example.org:7443",
                            "GetResult", world.done)
    assert "signed for coordinator 'coord-b.example.org'" in world.refused("GetResult", elsewhere, unauth)
    elsewhere.audience = "localhost"
    assert "does not verify" in world.refused("GetResult", elsewhere, unauth)
    old = signed(world.member, "GetResult", world.done)
    old.ClearField("audience")
    old.ClearField("format")
    why = world.refused("GetResult", old, unauth)
    assert "signed in format 1 (an earlier release's" in why and "update the device's fedsketch" in why


def test_a_round_is_shown_to_the_devices_of_its_study_only(coordinator_round):
    """A refinement round publishes its study's centres C_t: a device on the study's roster
    lists and reads it (it needs them for its next release); another device does not see it."""
    r = coordinator_round
    parent = r.create(refined_spec())
    x = np.zeros((10, 3))
    member, outsider = r.agent("member", x), r.agent("outsider", x)
    r.store.register(parent.study_id, member.ledger.identity().device_id)
    rid = plant_round(r, parent)
    stub = r.device_stub()
    assert _ids(stub.ListStudies(signed(member, "ListStudies"))) == [parent.study_id, rid]
    assert stub.GetStudy(signed(member, "GetStudy", rid)).spec_json == r.store.get_study(rid).spec_json
    assert _ids(stub.ListStudies(signed(outsider, "ListStudies"))) == [parent.study_id]
    for agent, method, sid in ((outsider, "GetStudy", rid),
                               (member, "GetResult", parent.study_id)):  # on its roster, no release
        with pytest.raises(grpc.RpcError) as err:
            getattr(stub, method)(signed(agent, method, sid))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
