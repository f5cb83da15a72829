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
    "alone, whether the sketch of --min-devices such devices will decode (a centroid's signal "
    "against the noise, as the decoder judges it), and warns if not.")]
StrictPlanOpt = Annotated[bool, typer.Option(
    help="Refuse (exit 1, nothing created) a study the planner does not expect to decode; needs "
    "--expected-records.")]


def report_plan(spec: StudySpec, expected_records: float | None, strict: bool) -> None:
    """Print the planner's prediction for ``spec`` on stderr, as a warning unless it is expected to
    work; ValueError (nothing is created) under ``strict`` unless it is expected to work."""
    if expected_records is None:
        if strict:
            raise ValueError("--strict needs --expected-records (records per device) to predict from")
        typer.echo("planner: give --expected-records (per device) to know whether this study's "
                   "sketch can be expected to decode", err=True)
        return
    if not (math.isfinite(expected_records) and expected_records > 0):
        raise ValueError(f"--expected-records (records per device) must be a finite number > 0, got "
                         f"{expected_records:g}")
    import numpy as np

    from fedsketch.common.study.planner import WORKS, plan_study
    from fedsketch.server.decode.identify import decoder_threshold

    plan = plan_study(spec, expected_records,
                      decoder_threshold(spec.sketch, np.array(spec.lo), np.array(spec.hi)))
    if plan.verdict == WORKS:
        typer.echo(plan.summary(), err=True)
    elif strict:
        raise ValueError(f"refused (--strict), nothing created: {plan.summary()}")
    else:
        typer.echo(f"warning: {plan.summary()}", err=True)


def result_noise(spec: StudySpec, residual: float, devices: int, records: float) -> float:
    """Say on stderr how much of a result's ``residual`` is noise; the noise's expected norm."""
    from fedsketch.common.study.planner import residual_noise

    norm, text = residual_noise(spec, residual, devices, records)
    typer.echo(text, err=True)
    return norm
