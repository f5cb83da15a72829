"""The utility planner in the operator's commands: ``create-study --expected-records [--strict]``
and the noise share of ``result``'s residual (:mod:`fedsketch.common.study.planner`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # the CLI imports this module at start: no numpy until a command runs
    from fedsketch.common.study.study import StudySpec

ExpectedRecordsOpt = Annotated[float | None, typer.Option(
    help="Records you expect each device to hold: the planner then predicts, from the public spec "
    "alone, the verdict the published centroids of --min-devices such devices will get (good, "
    "usable with caveats, unreliable: after the refinement rounds where there are any), and warns "
    "unless good.")]
StrictPlanOpt = Annotated[bool, typer.Option(
    help="Refuse (exit 1, nothing created) a study whose centroids the planner does not predict "
    "good; needs --expected-records.")]


def check_expected(expected_records: float) -> float:
    """``--expected-records``, a finite number > 0; ValueError in words otherwise."""
    if not (math.isfinite(expected_records) and expected_records > 0):
        raise ValueError(f"--expected-records (records per device) must be a finite number > 0, got "
                         f"{expected_records:g}")
    return expected_records


def report_plan(spec: StudySpec, expected_records: float | None, strict: bool) -> None:
    """Print the planner's forecast of the verdict for ``spec`` on stderr
    (:func:`fedsketch.common.study.forecast.forecast`), as a warning unless "good"; ValueError
    (nothing is created) under ``strict`` unless "good"."""
    if expected_records is None:
        if strict:
            raise ValueError("--strict needs --expected-records (records per device) to predict from")
        typer.echo("planner: give --expected-records (per device) to know whether this study's "
                   "sketch can be expected to decode", err=True)
        return
    check_expected(expected_records)
    import numpy as np

    from fedsketch.common.study.forecast import forecast
    from fedsketch.common.study.verdict import GOOD
    from fedsketch.server.decode.identify import decoder_threshold

    fc = forecast(spec, expected_records,
                  decoder_threshold(spec.sketch, np.array(spec.lo), np.array(spec.hi)))
    text = f"planner: the published centroids are expected to be {fc.status}: {fc.reason}"
    if fc.status == GOOD:
        typer.echo(text, err=True)
    elif strict:
        raise ValueError(f"refused (--strict), nothing created: {text}")
    else:
        typer.echo(f"warning: {text}", err=True)


def result_noise(spec: StudySpec, residual: float, devices: int, records: float) -> float:
    """Say on stderr how much of a result's ``residual`` is noise; the noise's expected norm."""
    from fedsketch.common.study.planner import residual_noise

    norm, text = residual_noise(spec, residual, devices, records)
    typer.echo(text, err=True)
    return norm
