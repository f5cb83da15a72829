"""What a simulation uses: round 0's σ range, and the ``config`` that ``simulate --json`` reports."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.scale import default_range

if TYPE_CHECKING:  # annotations only: simulate imports this module
    from fedsketch.common.study.study import StudySpec
    from fedsketch.server.sim.simulate import SimConfig


def round0_range(cfg: SimConfig) -> tuple[float, float]:
    """The σ range (data units) round 0 searches under --scale auto: ``cfg.scale_range``, or the
    default of the study's public box (:func:`~fedsketch.common.sketch.scale.default_range`)."""
    return default_range(Box(*cfg.public_box)) if cfg.scale_range is None else cfg.scale_range


def used_config(cfg: SimConfig, spec: StudySpec, calibration: dict | None) -> dict:
    """What the run used, JSON-ready: every field of ``cfg``, with ``scale`` the σ the sketch
    was taken at (round 0's choice under --scale auto, flagged by ``scale_auto``), ``scale_range``
    the range round 0 searched (None with a fixed σ), ``box`` the study's public box, and the
    synthetic mixture's ``bound`` and ``separation`` None when the records came from a file."""
    out = asdict(cfg)
    lo, hi = cfg.public_box
    out["box"] = [lo, hi]
    out["scale_auto"] = cfg.scale is None
    if cfg.scale is None:
        out["scale"] = None if calibration is None else calibration.get("sigma")
    plan = spec.calibration
    out["scale_range"] = None if plan is None else [plan.sigma_lo, plan.sigma_hi]
    if cfg.box is not None:
        out["bound"] = out["separation"] = None
    return out
