"""Specs parsed from another party's JSON (a device reads a coordinator's, a coordinator an
operator's) refuse JSON nested deeper than the interpreter's stack with a ValueError, which
both sides handle as a malformed spec, rather than a RecursionError that neither expects; and
they take each number only as a JSON number (fedsketch.common.spec_fields), never converted."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest
from conftest import study_spec

from fedsketch.common.study.calibration_round import SketchRound, split_auto
from fedsketch.common.study.refine import RefineSpec, RoundSpec
from fedsketch.common.study.study import StudySpec

DEEP = ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000, '{"format": ' + "[" * 100_000]


@pytest.mark.parametrize("parse", [StudySpec.from_json, RoundSpec.from_json])
@pytest.mark.parametrize("text", DEEP)
def test_a_spec_nested_too_deeply_is_a_value_error(parse, text):
    with pytest.raises(ValueError):
        parse(text)


def _study_json() -> dict:
    """A study with every optional part a plain study can have: a deadline, a roster and its
    window, round 0 and refinement rounds."""
    plan, rest = split_auto(10.0)
    base = study_spec(epsilon=rest)
    sketch = replace(base.sketch, frequencies=replace(base.sketch.frequencies, scale=plan.placeholder))
    spec = StudySpec.create("t", sketch, 3, base.lo, base.hi, calibration=plan, deadline=2e9,
                            refine=RefineSpec((1.0, 1.0)), roster=2, collect_seconds=60.0)
    return json.loads(spec.to_json())


def _round_json() -> dict:
    return json.loads(RoundSpec("st-1", "0" * 64, 1, ((1.0, 2.0, 3.0),), 2, 2e9).to_json())


def _sketch_round_json() -> dict:
    return json.loads(SketchRound("st-1", "0" * 64, 2.0, "1" * 64, 2e9, {"sigma": 2.0}, 2).to_json())


#: (parser, JSON maker, path of a field, whether it is an integer): every number in the specs.
NUMBERS = [(StudySpec.from_json, _study_json, path, integral) for path, integral in (
    ("k", True), ("min_devices", True), ("min_records", True), ("replicates", True),
    ("decode_seed", True), ("deadline", False), ("lo[0]", False), ("hi[1]", False),
    ("roster", True), ("collect_seconds", False), ("max_device_records", True),
    ("sketch.r", True), ("sketch.privacy.epsilon", False), ("sketch.privacy.delta", False),
    ("sketch.frequencies.m", True), ("sketch.frequencies.scale", False),
    ("sketch.frequencies.seed", True), ("refine.epsilon[1]", False),
    ("refine.round_seconds", False), ("refine.radius", False), ("calibration.epsilon", False),
    ("calibration.m0", True), ("calibration.sigma_lo", False), ("calibration.sigma_hi", False),
    ("calibration.round_seconds", False))] + [
    (RoundSpec.from_json, _round_json, path, integral) for path, integral in (
        ("round", True), ("min_devices", True), ("deadline", False), ("radius", False),
        ("centroids[0][2]", False))] + [
    (SketchRound.from_json, _sketch_round_json, path, integral) for path, integral in (
        ("sigma", False), ("deadline", False), ("min_devices", True))]


def _swap(data: dict, path: str, value: object) -> None:
    """Set the field at ``path`` ("a.b[1]") of the JSON ``data`` to ``value``."""
    *parents, leaf = re.findall(r"[^.\[\]]+", path)
    for key in parents:
        data = data[int(key)] if isinstance(data, list) else data[key]
    data[int(leaf) if isinstance(data, list) else leaf] = value


@pytest.mark.parametrize(("parse", "make", "path", "integral"), NUMBERS,
                         ids=[f"{p.__qualname__}-{path}" for p, _, path, _ in NUMBERS])
def test_a_number_of_another_json_type_is_refused_naming_the_field(parse, make, path, integral):
    """A number given as a string, a boolean or NaN (and an integer as 3.0) is refused, not
    converted, and the error names the field; the spec as written parses."""
    parse(json.dumps(make()))
    for bad in ["2", "0.5", True, math.nan, *([2.0] if integral else [])]:
        data = make()
        _swap(data, path, bad)
        with pytest.raises(ValueError) as err:
            parse(json.dumps(data))
        assert path.rpartition(".")[2] in str(err.value), (bad, str(err.value))
