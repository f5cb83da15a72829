"""What ``create-study`` says of one device's weight (``largest_weight``), for each kind of study:
only a study validated by a helper bounds each input by its own count, so only its message says
a device carries at most the cap's weight; a plain study's states the factor by which the entry
check lets a sketch's L1 mass exceed its records' (2m·γ/(r·κ)), a SecAgg+ study's the aggregate
check (docs/operator-guide.md, "The per-device record cap")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fedsketch.server.cli.create_study import largest_weight
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import _study_spec


def _spec(kind: str, feature: str):
    spec = _study_spec(SimConfig(devices=10, records=20_000, m=1000, feature=feature, r=1,
                                 secure_aggregation=kind != "plain"), 8_000)
    if kind == "validated":
        spec = replace(spec, secure_aggregation=replace(spec.secure_aggregation,
                                                        validation="helper", helper="localhost:1",
                                                        helper_ca="-----BEGIN CERTIFICATE-----\n"))
    return spec


@pytest.mark.parametrize(("feature", "factor"), [("quantized", "1,000x"), ("complex", "1,412x")])
def test_a_plain_study_states_how_far_the_entry_check_lets_a_sketch_exceed_its_records(feature,
                                                                                      factor):
    text = largest_weight(_spec("plain", feature), 2000.0)
    assert text.startswith("one device may declare at most 8,000 records (max_device_records): "
                           "at that count, 30.8% of the average against 9 devices")
    assert f"L1 mass reach {factor} its n records'" in text and "carries at most" not in text


def test_a_secure_study_without_validation_has_only_the_aggregate_check():
    text = largest_weight(_spec("secure", "quantized"), None)
    assert "its input only through the aggregate check" in text and "carries at most" not in text


def test_only_a_validated_study_bounds_each_input_by_its_count():
    text = largest_weight(_spec("validated", "quantized"), None)
    assert "proven within that count's range" in text
    assert text.endswith("it carries at most the cap's weight")
