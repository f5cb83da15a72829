"""A simulation's configuration (:class:`SimConfig`) and what it uses: round 0's σ range, and the
``config`` that ``simulate --json`` reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from fedsketch.common.choices import BOX_ROUND_FRACTION
from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.scale import default_range

if TYPE_CHECKING:
    from fedsketch.common.study.study import StudySpec

#: Who runs a simulation's devices: this process (the default), or Ray actors.
BACKENDS = ("inprocess", "ray")


@dataclass(frozen=True)
class SimConfig:
    """One simulation (see ``fedsketch simulate --help`` for each field)."""

    devices: int = 20
    records: int = 1_000_000
    k: int = 10
    d: int = 10
    m: int | None = None  # None: planned (:func:`fedsketch.common.study.sizing.study_size`)
    feature: str = "complex"
    epsilon: float = 1.0
    delta: float = 0.0
    neighbouring: str = "replace_one"
    r: int = 1
    scale: float | None = 2.0
    bound: float = 15.0
    separation: float = 2.5
    partition: str = "iid"
    processes: bool = False
    replicates: int = 3
    seed: int = 0
    secure_aggregation: bool = False
    threshold: int | None = None
    max_dropout: float | None = None
    max_colluders: float = 0.0
    degree: int | None = None
    stage_timeout: float | None = None  # None: default_stage_timeout(devices)
    dropout: float = 0.0
    dropout_stage: str = "masked_input"
    box: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    rounds: int = 0
    round_share: float | None = None  # None: planned (:func:`fedsketch.common.study.sizing.plan_study`)
    scale_range: tuple[float, float] | None = None
    hostile: str | None = None  # K:KIND (server/sim/hostile.py)
    validation: str | None = None  # "helper": a validated secure study (server/sim/helper_process.py)
    backend: str = "inprocess"
    address: str | None = None  # a Ray cluster's address (backend "ray"); None: a local Ray
    auto_box: bool = False  # --bounds auto: the study's box round reads the box
    box_fraction: float = BOX_ROUND_FRACTION

    @property
    def public_box(self) -> tuple[list[float], list[float]]:
        """(lo, hi) of the study: ``box`` when given (a data file's), else ±``bound``."""
        if self.box is not None:
            return list(self.box[0]), list(self.box[1])
        return [-self.bound] * self.d, [self.bound] * self.d


def round0_range(cfg: SimConfig) -> tuple[float, float]:
    """The σ range (data units) round 0 searches under --scale auto: ``cfg.scale_range``, or the
    default of the study's public box (:func:`~fedsketch.common.sketch.scale.default_range`)."""
    return default_range(Box(*cfg.public_box)) if cfg.scale_range is None else cfg.scale_range


def used_config(cfg: SimConfig, spec: StudySpec, calibration: dict | None,
                box: dict | None = None) -> dict:
    """What the run used, JSON-ready: every field of ``cfg``, with ``m`` the study's (planned from
    N, L, d, k and the sketch's ε unless given, flagged by ``m_planned``), ``round_share`` the
    rounds' share of ε after round 0 (planned unless given), ``scale`` the σ the sketch
    was taken at (round 0's choice under --scale auto, flagged by ``scale_auto``), ``scale_range``
    the range round 0 searched (None with a fixed σ), ``box`` the study's public box, and the
    synthetic mixture's ``bound`` and ``separation`` None when the records came from a file, and
    ``stage_timeout`` the secure round's (the default for L devices unless given; None for a
    plain study); with ``auto_box``, ``box`` is the one the box round read (``box``: its
    outcome; None if the study failed) and ``scale_range`` the range searched in it."""
    out = asdict(cfg)
    lo, hi = cfg.public_box
    out["box"] = [lo, hi]
    if cfg.auto_box:
        out["box"] = None if box is None else [box["lo"], box["hi"]]
        out["bound"] = out["separation"] = None
    out["m"] = spec.sketch.frequencies.m
    out["m_planned"] = cfg.m is None
    if spec.refine is not None:  # the share used: the operator's, or the plan's
        out["round_share"] = spec.refine.total / (spec.refine.total + spec.sketch.privacy.epsilon)
    out["scale_auto"] = cfg.scale is None
    if cfg.scale is None:
        out["scale"] = None if calibration is None else calibration.get("sigma")
    plan = spec.calibration
    out["scale_range"] = None if plan is None else [plan.sigma_lo, plan.sigma_hi]
    if cfg.auto_box and plan is not None and spec.box is not None and spec.box.derive_range:
        out["scale_range"] = None if box is None else list(default_range(Box(box["lo"], box["hi"])))
    if cfg.box is not None:
        out["bound"] = out["separation"] = None
    out["stage_timeout"] = (None if spec.secure_aggregation is None
                            else spec.secure_aggregation.stage_timeout)
    return out
