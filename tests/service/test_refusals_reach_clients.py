"""How the coordinator's refusals and errors reach a device and an operator: a device whose
REGISTER is refused for good says why and goes on with its pass; the command line prints the
status and the coordinator's message, with control characters escaped."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import typer
from conftest import META, study_spec

from fedsketch.common.cli import clean_errors
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec


def test_a_device_refused_at_register_says_why_and_finishes_its_pass(coordinator_round):
    """Two devices of 3,000 records for a secure study that takes 5,000 in all: the coordinator
    refuses the second one's REGISTER (INVALID_ARGUMENT); the device reports it as its reason
    for the study and its pass still handles the plain study listed after it."""
    sketch = SketchSpec(FrequencySpec(d=3, m=40, scale=1.5, seed=2), "quantized", 4,
                        PrivacySpec(1000.0))
    secure = coordinator_round.create(StudySpec.create(
        "secure", sketch, 3, [-10.0] * 3, [10.0] * 3, min_devices=3, replicates=1,
        secure_aggregation=SecAggSpec.assuming(Assumptions(3, 0, 0), 5000, None, 600.0, None)))
    x, _, _ = gmm(3000, 3, 3, 3.0, seed=1)
    first = coordinator_round.agent("first", x)
    for _ in range(2):  # prepares its input, then registers
        assert secure.study_id not in first.step().refused
    big = coordinator_round.agent("big", x)
    big.step()  # prepares its input
    plain = coordinator_round.create(study_spec(min_devices=2))  # listed after the secure study
    out = big.step()
    reason = out.refused[secure.study_id]
    assert "refused the REGISTER message: INVALID_ARGUMENT" in reason
    assert "above the study's max_records 5,000" in reason
    assert coordinator_round.coordinator.round_of(secure.study_id).held_messages() == 1  # the first's
    assert plain.study_id in out.registered


def test_the_command_line_prints_an_internal_error_with_its_id(coordinator_round, monkeypatch, capsys):
    def broken(study_id):
        raise RuntimeError("a bug")

    monkeypatch.setattr(coordinator_round.coordinator, "study", broken)
    with pytest.raises(typer.Exit), clean_errors():
        coordinator_round.operator().ShowStudy(pb.StudyRef(study_id="st-1"), metadata=META, timeout=20)
    err = capsys.readouterr().err
    assert err.startswith("error: INTERNAL: internal error ")
    assert "coordinator's log" in err and "a bug" not in err


def test_the_command_line_escapes_a_hostile_coordinator_s_message(capsys):
    """A coordinator's status message is shown with its control characters escaped, so it
    cannot drive the operator's terminal."""
    def refuse(request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad \x1b[2J\x1b]0;owned\x07 study")

    server = grpc.server(ThreadPoolExecutor(2))
    handler = grpc.unary_unary_rpc_method_handler(refuse)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("fedsketch.v1.Device", {"GetStudy": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(typer.Exit), clean_errors():
                pb_grpc.DeviceStub(channel).GetStudy(pb.DeviceRead(study_id="st-1"), timeout=20)
    finally:
        server.stop(None).wait()
    err = capsys.readouterr().err
    assert err == "error: INVALID_ARGUMENT: bad \\x1b[2J\\x1b]0;owned\\x07 study\n"
