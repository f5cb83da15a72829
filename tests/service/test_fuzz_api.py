"""Garbage at every RPC of a real coordinator (TLS on loopback, a real SQLite store): random
bytes, random messages, and signed mutations of valid ones (contributions, registrations,
secure-aggregation stage messages, study specs). No reply may be UNKNOWN or INTERNAL (either
would be an exception the coordinator did not judge), and garbage changes nothing: the
database is compared table by table, and the secure round's state, before and after.

Hypothesis runs derandomized (the same examples on every run), so the suite stays repeatable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import sqlite3
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import META, OPERATOR_TOKEN, study_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsketch.common.net import signing
from fedsketch.common.net.device_reads import signed_read
from fedsketch.common.net.tls import secure_channel, server_tls
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.server.errors import Refusal
from fedsketch.server.service.api import build_server
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.service.handlers import ENVELOPE_BYTES, MAX_REQUEST_BYTES, message_type
from fedsketch.server.service.reads import READ_METHODS, READ_WINDOW_SECONDS
from fedsketch.server.store import Store, open_store

#: Statuses that mean the coordinator met an exception it did not judge.
UNJUDGED = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
#: Every method the coordinator serves, as "Service/Method" (the Helper service is another
#: process's, `fedsketch helper serve`: tests/helper/test_helper_processes.py sends it the same bytes).
METHODS = [f"{s.name}/{m.name}" for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods
           if s.name != "Helper"]
FUZZ = settings(max_examples=600, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@dataclass
class Edge:
    """A running coordinator with an enrolled device, a plain study whose roster (of that one
    device) is full, and a secure study at REGISTER."""

    channel: grpc.Channel
    db: Path
    store: Store
    coordinator: Coordinator
    key: bytes
    device_id: str
    plain: pb.Study
    secure: pb.Study

    def raw(self, method: str, body: bytes, operator: bool = True) -> grpc.StatusCode:
        """Send ``body`` as the request of ``method``; the reply's status."""
        call = self.channel.unary_unary(f"/fedsketch.v1.{method}")
        try:
            call(body, timeout=20, metadata=META if operator else None)
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    def send(self, method: str, request, operator: bool = True) -> grpc.StatusCode:
        return self.raw(method, request.SerializeToString(), operator)

    def stage(self, study_id: str, stage: int, body: bytes) -> pb.SecAggMessage:
        """A stage message signed by the device (a stage that is no u32 gets a junk signature)."""
        try:
            digest = sw.message_digest(study_id, self.device_id, stage, body)
        except struct.error:
            digest = bytes(32)
        return pb.SecAggMessage(study_id=study_id, device_id=self.device_id, stage=stage,
                                body=body, signature=signing.sign(self.key, digest))


def secure_spec() -> StudySpec:
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), "quantized", 4,
                        PrivacySpec(1000.0))
    sa = SecAggSpec.assuming(Assumptions(3, 0, 0), 100_000, None, 600.0, None)
    return StudySpec.create("secure", sketch, 3, [-10.0] * 3, [10.0] * 3, min_devices=3,
                            replicates=1, secure_aggregation=sa)


def tables(db: Path) -> dict[str, list]:
    """Every row of every table, sorted (a second connection: the store's commits are visible)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}"))) for t in names}
    finally:
        con.close()


@pytest.fixture(scope="module")
def edge(tmp_path_factory, certs):
    folder = tmp_path_factory.mktemp("fuzz")
    store = open_store(folder / "coordinator.db")
    server, coordinator, port = build_server(
        store, hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(), "127.0.0.1:0",
        server_tls(certs.server_cert, certs.server_key))
    channel = secure_channel(f"localhost:{port}", certs.ca_cert)
    try:
        op, dev = pb_grpc.OperatorStub(channel), pb_grpc.DeviceStub(channel)
        token = op.IssueTokens(pb.IssueTokensRequest(count=1), metadata=META).tokens[0]
        key = signing.new_private_key()
        device_id = dev.Enroll(pb.EnrollRequest(token=token, public_key=signing.public_key(key),
                                                label="fuzz")).device_id
        plain = op.CreateStudy(pb.CreateStudyRequest(spec_json=study_spec(min_devices=1).to_json()),
                               metadata=META)
        digest = signing.registration_digest(plain.study_id, device_id, plain.spec_sha256)
        reply = dev.Register(pb.Registration(study_id=plain.study_id, device_id=device_id,
                                             spec_sha256=plain.spec_sha256,
                                             signature=signing.sign(key, digest)))
        assert reply.stage == pb.PLAIN_INPUT
        secure = op.CreateStudy(pb.CreateStudyRequest(spec_json=secure_spec().to_json()),
                                metadata=META)
        yield Edge(channel, folder / "coordinator.db", store, coordinator, key, device_id, plain,
                   secure)
    finally:
        channel.close()
        server.stop(grace=None).wait()
        coordinator.stop()
        store.close()


@pytest.fixture
def unchanged(edge):
    """The test leaves the database and the secure round exactly as it found them."""
    before = tables(edge.db)
    rnd = edge.coordinator.round_of(edge.secure.study_id)
    state = (rnd.stage, rnd.deadline, rnd.held_messages())
    yield
    assert (rnd.stage, rnd.deadline, rnd.held_messages()) == state
    after = tables(edge.db)
    assert after == before, [t for t in before if after[t] != before[t]]


# --- the edge itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_unparseable_bytes_get_invalid_argument_naming_the_message(edge, method, unchanged):
    """Each method receives raw bytes and parses them itself: bytes that are no protobuf (an
    over-long varint tag) get INVALID_ARGUMENT naming the expected message, not grpcio's
    generic deserialization failure."""
    service, name = method.split("/")
    expected = pb.DESCRIPTOR.services_by_name[service].methods_by_name[name].input_type.full_name
    call = edge.channel.unary_unary(f"/fedsketch.v1.{method}")
    with pytest.raises(grpc.RpcError) as err:
        call(b"\xff" * 11, timeout=20, metadata=META)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"not a well-formed {expected} message" in err.value.details()


def test_every_method_has_a_size_limit_and_refuses_more_before_parsing(edge, unchanged):
    assert sorted(m for m in MAX_REQUEST_BYTES if not m.startswith("Helper/")) == sorted(METHODS)
    ref = pb.StudyRef(study_id="x" * ENVELOPE_BYTES)  # a well-formed message, one byte per char
    call = edge.channel.unary_unary("/fedsketch.v1.Device/GetStudy")
    with pytest.raises(grpc.RpcError) as err:
        call(ref.SerializeToString(), timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {ENVELOPE_BYTES} bytes" in err.value.details()
    ok = pb.StudyRef(study_id="x" * (ENVELOPE_BYTES - 10))  # within the limit: judged on its content
    assert edge.send("Operator/ShowStudy", ok) == grpc.StatusCode.NOT_FOUND


def test_a_long_field_quoted_in_a_refusal_is_cut_short(edge, unchanged):
    """A refusal quoting a client's field stays within what a client accepts as a trailer."""
    call = edge.channel.unary_unary("/fedsketch.v1.Device/SecAggFetch")
    msg = pb.SecAggMessage(study_id=edge.secure.study_id, device_id="d" * 20_000, stage=pb.REGISTER,
                           signature=bytes(64))
    with pytest.raises(grpc.RpcError) as err:
        call(msg.SerializeToString(), timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # 20 kB is over the envelope
    send = pb_grpc.DeviceStub(edge.channel).SecAggSend
    with pytest.raises(grpc.RpcError) as err:
        send(msg, timeout=20)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(err.value.details()) <= 1001


def test_a_bug_reaches_the_client_as_internal_with_an_id_the_log_explains(edge, monkeypatch, caplog):
    """An exception that is no refusal (a stand-in bug in the coordinator): the client gets
    INTERNAL with a short error id and nothing of the exception; the log has the id with the
    traceback."""
    def broken(study_id):
        raise RuntimeError("secret detail of a bug")

    monkeypatch.setattr(edge.coordinator, "study", broken)
    caplog.set_level(logging.ERROR, "fedsketch.coordinator")
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.OperatorStub(edge.channel).ShowStudy(pb.StudyRef(study_id=edge.plain.study_id),
                                                     metadata=META, timeout=20)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    error_id = re.fullmatch(r"internal error ([0-9a-f]{8}) in the coordinator; .*", err.value.details())[1]
    assert "secret" not in err.value.details()
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(logged) == 1 and "Operator/ShowStudy" in logged[0].getMessage()
    assert "secret detail of a bug" in caplog.text and "Traceback" in caplog.text


# --- fuzzing -----------------------------------------------------------------------------------

#: Methods whose random requests, with the operator's credential, may legitimately succeed and
#: write (IssueTokens with a count in range, CloseStudy of a real study); they are sent without
#: the credential by the tests that draw such requests.
WRITES = {"Operator/IssueTokens", "Operator/CloseStudy"}


@FUZZ
@given(method=st.sampled_from(METHODS), body=st.binary(max_size=400), operator=st.booleans())
def test_random_bytes(edge, method, body, operator, unchanged):
    code = edge.raw(method, body, operator and method not in WRITES)
    assert code not in UNJUDGED


def _field_values(edge: Edge) -> dict[str, st.SearchStrategy]:
    """Strategies for each field name of the request messages: real ids some of the time."""
    ids = st.sampled_from([edge.plain.study_id, edge.secure.study_id, "", "st-0"]) | st.text()
    hashes = st.sampled_from([edge.plain.spec_sha256, edge.secure.spec_sha256]) | st.text()
    return {
        "study_id": ids, "device_id": st.sampled_from([edge.device_id, ""]) | st.text(),
        "spec_sha256": hashes, "token": st.text(), "label": st.text(),
        "public_key": st.binary(max_size=64), "signature": st.binary(max_size=80),
        "body": st.binary(max_size=200), "spec_json": st.text(),
        "stage": st.integers(-2**31, 2**31 - 1), "count": st.integers(-2**31, 0),
        "include_closed": st.booleans(), "join_only": st.booleans(),
        "limit": st.integers(-2**31, 2**31 - 1), "reason": st.integers(-2**31, 2**31 - 1),
        "n": st.floats(allow_nan=True, allow_infinity=True),
        "budget_epsilon": st.floats(allow_nan=True, allow_infinity=True),
        "budget_delta": st.floats(allow_nan=True, allow_infinity=True),
        "signed_at": st.floats(allow_nan=True, allow_infinity=True) | st.just(time.time()),
        "audience": st.sampled_from(["localhost", ""]) | st.text(),
        "format": st.integers(0, 2**32 - 1),
        "int32_pairs": st.binary(max_size=600), "int64_pairs": st.binary(max_size=1200),
        "int64_cells": st.binary(max_size=200), "round_sha256": st.binary(max_size=40),
    }


@FUZZ
@given(data=st.data())
def test_random_messages(edge, data, unchanged):
    """Well-formed messages of every method's request type with arbitrary field values (real
    study and device ids some of the time; IssueTokens counts out of range)."""
    values = _field_values(edge)
    method = data.draw(st.sampled_from(METHODS))
    service, name = method.split("/")
    request_type = message_type(
        pb.DESCRIPTOR.services_by_name[service].methods_by_name[name].input_type.full_name)
    fields = [f.name for f in request_type.DESCRIPTOR.fields]
    if "int32_pairs" in fields:  # one payload of the oneof
        kind = data.draw(st.sampled_from(["int32_pairs", "int64_pairs", "int64_cells", None]))
        fields = [f for f in fields if f not in ("int32_pairs", "int64_pairs", "int64_cells")]
        fields += [kind] if kind else []
    request = request_type(**{f: data.draw(values[f]) for f in fields})
    assert edge.send(method, request, operator=method not in WRITES) not in UNJUDGED


@settings(FUZZ, max_examples=200)
@given(method=st.sampled_from(READ_METHODS),
       study_id=st.sampled_from(["", "st-0", "x" * 3000]) | st.text(),
       offset=st.sampled_from([0.0, -READ_WINDOW_SECONDS - 60, READ_WINDOW_SECONDS + 60]) | st.floats(),
       real_study=st.booleans())
def test_signed_reads(edge, method, study_id, offset, real_study, unchanged):
    """Reads signed by the enrolled device (on the plain study's roster, no contribution), for
    any study id, signed at any time: each is judged, one outside the freshness window is
    UNAUTHENTICATED, and none writes anything."""
    if real_study:
        study_id = "" if method == "ListStudies" else edge.plain.study_id
    at = time.time() + offset
    read = signed_read(edge.key, edge.device_id, "localhost", method, study_id, at)
    code = edge.send(f"Device/{method}", read, operator=False)
    assert code not in UNJUDGED
    if not abs(offset) <= READ_WINDOW_SECONDS + 30:  # outside the window, a margin for the clock
        assert code == grpc.StatusCode.UNAUTHENTICATED
    elif real_study and abs(offset) < READ_WINDOW_SECONDS - 30:
        assert code == (grpc.StatusCode.PERMISSION_DENIED if method == "GetResult" else grpc.StatusCode.OK)


#: Record counts no contribution or REGISTER may declare, besides arbitrary floats.
HOSTILE_COUNTS = [0, -1, 1.5, 2**40 + 1, 2**53 + 1, 10**400, float("inf"), float("nan"), True,
                  None, "12", [12], {"n": 12}]


@FUZZ
@given(n=st.sampled_from([x for x in HOSTILE_COUNTS if isinstance(x, float)]) | st.floats(),
       kind=st.sampled_from(["int32_pairs", "int64_pairs", "int64_cells"]),
       payload=st.binary(max_size=1200).filter(lambda b: len(b) != 16 * 60), exact=st.booleans())
def test_signed_contributions(edge, n, kind, payload, exact, unchanged):
    """Contributions signed by the roster device of an open plain study (so every check below
    the signature runs): any payload, any count. A payload of the right length starts with the
    largest int64, beyond any entry a mechanism can produce, so none can be accepted."""
    m = 60
    if exact:
        payload = struct.pack("<q", 2**63 - 1) + bytes(16 * m - 8)
    sid, sha = edge.plain.study_id, edge.plain.spec_sha256
    digest = signing.contribution_digest(sid, edge.device_id, n, sha, payload)
    request = pb.Contribution(study_id=sid, device_id=edge.device_id, spec_sha256=sha, n=n,
                              signature=signing.sign(edge.key, digest), **{kind: payload})
    code = edge.send("Device/Submit", request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


#: REGISTER bodies that must be refused: bad counts, bad shapes, deep nesting, not JSON.
BAD_REGISTERS = ([_json({"n": n}) for n in HOSTILE_COUNTS if not isinstance(n, float)]
                 + [b'{"n": 1e400}', b'{"n": -1e400}', b'{"n": NaN}', b"[" * 100_000 + b"]" * 100_000,
                    b'{"n":' * 50_000, _json([]), _json("n"), b"", b"\xff\xfe", b"{}",
                    _json({"n": 10**5 + 1}), _json({"m": 12})])

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=12)


def _refused(body: bytes) -> bool:
    """Whether a REGISTER body is no valid one (for the secure study: an integer n in 1..10^5)."""
    try:
        n = json.loads(body).get("n")
    except (ValueError, RecursionError, AttributeError):
        return True
    return not (type(n) is int and 1 <= n <= 100_000)


@FUZZ
@given(body=(st.sampled_from(BAD_REGISTERS) | json_values.map(_json) | st.binary(max_size=200)
             | json_values.map(lambda v: _json({"n": v}))).filter(_refused),
       stage=st.sampled_from(sw.STAGES) | st.integers(-2**31, 2**31 - 1),
       fetch=st.booleans())
def test_signed_stage_messages(edge, body, stage, fetch, unchanged):
    """Stage messages and fetches signed by an enrolled device for a secure study at REGISTER:
    malformed REGISTER bodies (counts beyond float range or the study's max_records, nested
    JSON, not JSON) and every stage number, known or not."""
    request = edge.stage(edge.secure.study_id, stage, b"" if fetch else body)
    code = edge.send("Device/SecAggFetch" if fetch else "Device/SecAggSend", request)
    assert code not in UNJUDGED
    if not fetch and stage == pb.REGISTER:
        assert code == grpc.StatusCode.INVALID_ARGUMENT


def _leaves(obj: object, path: tuple = ()) -> list[tuple]:
    """Paths to every leaf (and every container) of a JSON value."""
    found = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            found += _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _leaves(v, (*path, i))
    return found


def _replace(obj: object, path: tuple, value: object) -> object:
    if not path:
        return value
    copy = dict(obj) if isinstance(obj, dict) else list(obj)
    copy[path[0]] = _replace(obj[path[0]], path[1:], value)
    return copy


#: What a spec field is replaced with: overflowing, non-finite, wrong types, deep nesting.
HOSTILE_VALUES = [10**400, -(10**400), 2**63, 2**40, -1, 0, 0.5, math.inf, -math.inf, math.nan, None, True,
                  "", "x", [], {}, [[[[[]]]]], "1e400", "DEEP"]
#: Written into the spec's text in place of the strings "1e400" and "DEEP".
TEXTUAL = {'"1e400"': "1e400", '"DEEP"': "[" * 100_000 + "]" * 100_000}
#: The tables a study's creation writes (its row, the audit log and the log's counter).
WRITTEN = ("studies", "audit", "sqlite_sequence")
SPECS = [study_spec(min_devices=2), study_spec(feature="quantized", r=6, neighbouring="add_remove"),
         secure_spec()]


@FUZZ
@given(data=st.data())
def test_mutated_study_specs(edge, data):
    """CreateStudy with a valid spec in which one field (or container) is replaced by a hostile
    value, or whose text has 1e400 or a huge integer in place of a number. A mutation that
    leaves a valid spec may create a study; nothing else may change."""
    before = tables(edge.db)
    spec = json.loads(data.draw(st.sampled_from(SPECS)).to_json())
    path = data.draw(st.sampled_from(_leaves(spec)))
    value = data.draw(st.sampled_from(HOSTILE_VALUES) | json_values)
    text = json.dumps(_replace(spec, path, value))
    for marker, raw in TEXTUAL.items():
        text = text.replace(marker, raw)
    try:
        made = pb_grpc.OperatorStub(edge.channel).CreateStudy(
            pb.CreateStudyRequest(spec_json=text), metadata=META, timeout=20)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.code()
        made = None
    after = tables(edge.db)
    assert len(after["studies"]) == len(before["studies"]) + (made is not None)
    assert {t: v for t, v in after.items() if t not in WRITTEN} == {
        t: v for t, v in before.items() if t not in WRITTEN}
    if made is not None and not edge.coordinator.spec(made.study_id).secure_aggregation:
        # ended now (it has no quorum: FAILED), so that its deadline, which the mutation may
        # have put anywhere, cannot have the watcher write in another test's snapshot
        try:
            edge.coordinator.close(made.study_id, "fuzz")
        except Refusal as exc:  # a deadline in the past: the watcher closed it first
            assert edge.store.get_study(made.study_id).state == "failed", exc


def test_a_study_whose_sketch_cannot_travel_is_refused(edge, unchanged):
    """m = 300,000: a device's sketch of 2m int64 would take 4.8 MB, more than one message, so
    the study could never receive a contribution; it is refused before its frequencies are
    drawn."""
    spec = json.loads(study_spec().to_json())
    spec["sketch"]["frequencies"]["m"] = 300_000
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.OperatorStub(edge.channel).CreateStudy(
            pb.CreateStudyRequest(spec_json=json.dumps(spec)), metadata=META, timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "m = 300000 is too large" in err.value.details()


# --- a secure round, garbage at every stage -----------------------------------------------------

#: Bodies that no stage parses into its message: not JSON, nested too deeply, the wrong shapes,
#: wrong types and bad base64 in each stage's fields.
BAD_BODIES = [b"", b"\xff\xfe", b"[", b"null", b"[]", b'"x"', b"1e400", b"[" * 100_000,
              b'{"a":' * 50_000, _json({"device_id": 1, "c_pk": 5, "s_pk": None, "signature": []}),
              _json({"device_id": "u", "c_pk": "@@", "s_pk": "@@", "signature": "@@"}),
              _json({"dev-x": 5}), _json({"dev-x": "@@"}), _json({"dev-x": ["k"]}),
              _json({"dev-x": ["k", "@@"]}), _json({"dev-x": ["k", "AA==", "x"]}), _json({"dev-x": 5.5}),
              _json({"signature": 5}), _json({"signature": "@@"}), bytes(7), bytes(8 * 81)]


def _garbage(valid: bytes, seed: int) -> list[bytes]:
    """BAD_BODIES, truncations of a stage's valid body (never JSON, nor the masked input's
    length), and random bytes that are not JSON."""
    rng = random.Random(seed)
    cuts = sorted({len(valid) * i // 7 for i in range(7)} | {len(valid) - 1})
    noise = [rng.randbytes(rng.randrange(1, 300)) for _ in range(20)]
    return BAD_BODIES + [valid[:i] for i in cuts] + [b for b in noise if _refused(b)]


def test_garbage_at_every_stage_of_a_secure_round_is_refused_and_changes_nothing(edge):
    """Three devices run a secure round over gRPC stage by stage (the protocol's own clients);
    before each stage's valid messages, the first device sends garbage signed with its key:
    each is refused with INVALID_ARGUMENT and the round and database stay as they were."""
    from fedsketch.common.secagg import Client
    op, dev = pb_grpc.OperatorStub(edge.channel), pb_grpc.DeviceStub(edge.channel)
    study = op.CreateStudy(pb.CreateStudyRequest(spec_json=secure_spec().to_json()), metadata=META)
    sid = study.study_id
    devices = []
    for token in op.IssueTokens(pb.IssueTokensRequest(count=3), metadata=META).tokens:
        key = signing.new_private_key()
        devices.append(Edge(edge.channel, edge.db, edge.store, edge.coordinator, key,
                            dev.Enroll(pb.EnrollRequest(token=token, public_key=signing.public_key(key)))
                            .device_id, edge.plain, study))
    rnd, clients = edge.coordinator.round_of(sid), {}

    def valid(d: Edge, stage: int) -> bytes:
        """The device's valid message for the open stage, from what the coordinator routed."""
        if stage == pb.REGISTER:
            return _json({"n": 100})
        body = dev.SecAggFetch(d.stage(sid, stage, b""), timeout=20).body
        obj = None if stage == pb.MASKED_INPUT else sw.load(body)
        if stage == pb.ADVERTISE_KEYS:
            params, keys, _ = sw.params_from_json(sid, obj)
            clients[d.device_id] = Client(params, d.device_id, d.key, keys)
            return sw.dump(sw.advert_to_json(clients[d.device_id].advertise()))
        c = clients[d.device_id]
        if stage == pb.SHARE_KEYS:
            return sw.dump(sw.bytes_map_to_json(c.share_keys(
                {v: sw.advert_from_json(a) for v, a in obj.items()})))
        if stage == pb.MASKED_INPUT:
            inbox = sw.bytes_map_from_json(sw.load(body))
            return sw.masked_to_bytes(c.masked_input(np.zeros(c.params.dim, dtype=np.int64), inbox))
        if stage == pb.CONSISTENCY:
            return sw.dump(sw.signature_to_json(c.sign_survivors(sw.survivors_from_json(obj))))
        return sw.dump(sw.unmask_to_json(c.unmask(sw.signed_from_json(obj))))

    for stage in sw.STAGES:
        assert rnd.stage == stage
        bodies = [valid(d, stage) for d in devices]
        before, held = tables(edge.db), rnd.held_messages()
        for bad in _garbage(bodies[0], stage):
            code = edge.send("Device/SecAggSend", devices[0].stage(sid, stage, bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (pb.Stage.Name(stage), bad[:60])
        assert (rnd.stage, rnd.held_messages(), tables(edge.db)) == (stage, held, before)
        for d, body in zip(devices, bodies, strict=True):
            dev.SecAggSend(d.stage(sid, stage, body), timeout=20)
    assert rnd.finished
