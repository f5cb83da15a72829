"""Specs parsed from another party's JSON (a device reads a coordinator's, a coordinator an
operator's) refuse JSON nested deeper than the interpreter's stack with a ValueError, which
both sides handle as a malformed spec, rather than a RecursionError that neither expects."""

from __future__ import annotations

import pytest

from fedsketch.common.refine import RoundSpec
from fedsketch.common.study import StudySpec

DEEP = ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000, '{"format": ' + "[" * 100_000]


@pytest.mark.parametrize("parse", [StudySpec.from_json, RoundSpec.from_json])
@pytest.mark.parametrize("text", DEEP)
def test_a_spec_nested_too_deeply_is_a_value_error(parse, text):
    with pytest.raises(ValueError):
        parse(text)
