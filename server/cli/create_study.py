"""``fedsketch coordinator create-study``: a study's public spec from the operator's options
(checked and, with ``--expected-records``, planned), sent to the coordinator (registered on
:data:`~fedsketch.server.cli.coordinator.coordinator_app`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.choices import (
    AUTO_FRACTION,
    BLIND_ROUND_SHARE,
    BOX_ROUND_FRACTION,
    CAP_HEADROOM,
    COLLECT_SECONDS,
    DEADLINE_SECONDS,
    DEFAULT_MAX_DEVICE_RECORDS,
    DEFAULT_R,
    FEATURES,
    LAWS,
    NEIGHBOURING,
    ROUND_SECONDS,
    ROUND_SHARE,
    ROUNDS,
)
from fedsketch.common.cli import CaOpt, InsecureOpt, JsonOpt, ScaleRangeOpt, Target
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.server.cli.errors import clean_errors
from fedsketch.server.cli.operator_link import TokenFile, operator_stub
from fedsketch.server.cli.planning import ExpectedRecordsOpt, StrictPlanOpt, check_expected, report_plan


def create_study(
    coordinator: Target,
    name: Annotated[str, typer.Option(help="Study name.")],
    d: Annotated[int, typer.Option(help="Dimension of the records.")],
    k: Annotated[int, typer.Option(help="Number of centroids.")],
    bounds: Annotated[str, typer.Option(
        help="Public box LO:HI or a bounds.json, or 'auto': the study's box round, in which "
             "every device releases noisy per-column histograms at --box-fraction of --epsilon "
             "and the coordinator reads the box from their sum (see below).")],
    scale: Annotated[str, typer.Option(
        help="σ in data units (public), or 'auto': the study's round 0, in which every device "
             "releases a private calibration sketch at --auto-fraction of --epsilon and the "
             "coordinator fits σ from their sum with `sketch --scale auto`'s rule (see below).")],
    epsilon: Annotated[float, typer.Option(help="ε each device spends in all, its sketch and "
                                           "every refinement round (finite, > 0).")],
    token_file: TokenFile = Path("operator.token"),
    ca: CaOpt = None,
    insecure: InsecureOpt = False,
    m: Annotated[int | None, typer.Option(
        help="Frequencies. Default: planned from --expected-records × --min-devices, d, k and the "
             "sketch's share of ε (the largest of 10, 5, 2, 1 ·k·d whose predicted signal clears "
             "the decoder's threshold, else 10·k·d; m·d·k at most 4·10⁵); without "
             "--expected-records, 10·k·d within that bound.")] = None,
    feature: Annotated[str, typer.Option(help=f"{', '.join(FEATURES)}.")] = "complex",
    law: Annotated[str, typer.Option(help=f"{', '.join(LAWS)}.")] = "adapted_radius",
    seed: Annotated[int, typer.Option(help="Public seed of Ω and ξ.")] = 0,
    r: Annotated[int, typer.Option(help="Entries per record, 1..m (default 1, as in every "
                                   "command; see `sketch --help`).")] = DEFAULT_R,
    delta: Annotated[float, typer.Option(help="δ (> 0: Gaussian).")] = 0.0,
    neighbouring: Annotated[str, typer.Option(help=f"{' or '.join(NEIGHBOURING)}.")] = (
        "replace_one"),
    min_devices: Annotated[int, typer.Option(help="Quorum: the fewest devices whose releases "
                                             "the study decodes.")] = 1,
    roster: Annotated[int | None, typer.Option(
        help="Most devices the roster takes (at least --min-devices, the default). Devices "
        "start once the quorum has registered; later ones may still join, so a roster device "
        "that never sends does not fail the study.")] = None,
    collect_seconds: Annotated[float | None, typer.Option(
        help="Seconds the study collects once its quorum has registered; then it decodes if "
        f"--min-devices have sent, else fails. Default {COLLECT_SECONDS:g} for a plain study; "
        "not with --secure-aggregation, whose stages end by --stage-timeout.")] = None,
    min_records: Annotated[int, typer.Option(
        help="Records a device needs (replace-one only: under add/remove n is private).")] = 1,
    max_device_records: Annotated[int | None, typer.Option(
        help="Public cap on the records one device may hold, so the most weight one device "
        "(hostile or not) carries in a plain study's average (a secure study's inputs: "
        "docs/bounded-influence.md); a device with more refuses the study, saying "
        f"why, and spends nothing. Default {CAP_HEADROOM} × the records expected per device: "
        "--expected-records, else --max-records / --min-devices under --secure-aggregation "
        f"(at most --max-records), else {DEFAULT_MAX_DEVICE_RECORDS:,}.")] = None,
    deadline: Annotated[float | None, typer.Option(
        help="Seconds from now after which the study stops collecting, whatever else (then it "
        "decodes if --min-devices have sent, else fails); it closes sooner once its whole roster "
        f"has sent. Default {DEADLINE_SECONDS:g} (a week) for a plain study, so one whose quorum "
        "never registers ends; not with --secure-aggregation.")] = None,
    replicates: Annotated[int, typer.Option(help="CL-OMPR replicates.")] = 3,
    secure_aggregation: Annotated[bool, typer.Option(
        "--secure-aggregation", help="Secure aggregation with distributed DLap noise "
        "(replace-one, pure ε).")] = False,
    max_dropout: Annotated[float | None, typer.Option(
        help="Fraction of the --min-devices roster that may drop out (secure aggregation; "
        "required): D = ⌈fraction·L⌉.")] = None,
    max_colluders: Annotated[float | None, typer.Option(
        help="Fraction that may collude with the coordinator (secure aggregation; required): "
        "C = ⌈fraction·L⌉.")] = None,
    threshold: Annotated[int | None, typer.Option(
        help="Shamir threshold t (default: the smallest safe one).")] = None,
    max_records: Annotated[int | None, typer.Option(help="Public bound on the total records "
                                                    "(sizes the modulus).")] = None,
    degree: Annotated[int | None, typer.Option(help="Neighbours per device (SecAgg+).")] = None,
    stage_timeout: Annotated[float, typer.Option(help="Seconds per stage, from when it opened "
                                                 "(a coordinator restart does not reset it).")] = 30.0,
    validation: Annotated[str | None, typer.Option(
        help="'helper': every secure input is proven in range before it counts, checked by the "
        "coordinator and a helper run by another party (docs/bounded-influence.md); a device "
        "whose proof fails is excluded. Needs --helper and --helper-ca.")] = None,
    helper: Annotated[str | None, typer.Option(
        help="The helper's HOST:PORT (--validation helper): in the spec every device sees.")] = None,
    helper_ca: Annotated[Path | None, typer.Option(
        help="The CA certificate (PEM) the helper's certificate is checked against; its text "
        "goes into the spec.")] = None,
    auto_fraction: Annotated[float, typer.Option(
        help="Share of --epsilon that round 0 takes with --scale auto.")] = AUTO_FRACTION,
    scale_range: ScaleRangeOpt = None,
    box_fraction: Annotated[float, typer.Option(
        help="Share of --epsilon that the box round takes with --bounds auto.")] = BOX_ROUND_FRACTION,
    rounds: Annotated[int, typer.Option(
        help="Refinement rounds after the sketch: private Lloyd steps across the devices, each "
        "a study of its own with its own roster, whose sums are offsets from the centres "
        "clipped to half the box; 0: the sketch alone.")] = ROUNDS,
    round_share: Annotated[float | None, typer.Option(
        help=f"Share of --epsilon the refinement rounds take together, in equal parts (default "
             f"{ROUND_SHARE:g}; {BLIND_ROUND_SHARE:g} when --expected-records plans a sketch that "
             "shows no centroid at all, whose ε is worth more in the rounds).")] = None,
    round_seconds: Annotated[float, typer.Option(
        help="Seconds each refinement round, and the sketch round after a --scale auto round 0, "
        "collects at most (it ends sooner once its roster has sent).")] = ROUND_SECONDS,
    expected_records: ExpectedRecordsOpt = None,
    strict: StrictPlanOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a study and print its id. A study that could overflow its secure-aggregation
    modulus, or that secure aggregation cannot serve, is refused with the reason.

    With --scale auto, the study starts with round 0: each device releases, once, a private
    calibration sketch of its records (m0 = 64 frequencies with radii spread over the σ range
    --scale-range, by default h/60:5h/3 for the box's mean half-width h; exact discrete noise
    at ε_0 = --auto-fraction·ε); the coordinator sums them and picks σ = max(envelope fit,
    0.8·typical-direction fit) when the sum is precise enough and that lies inside the range,
    else the box's mean half-width / 7 (post-processing only), shows σ and why in `status` and
    `result`,
    and opens the sketch round with that σ fixed in its hashed spec. Round 0 without its quorum
    fails the study before anyone spends on the sketch. The rest, (1 − fraction)·ε, goes to the
    sketch and refinement rounds as below.

    With --bounds auto, the study starts with its box round: each device releases, once, one
    histogram of each column of its records on a scale-free logarithmic grid (8 bins an
    octave) plus exact discrete-Laplace noise at ε_b = --box-fraction·ε; the coordinator sums
    them, reads each column's span up to its farthest significant run of bins (a run of w
    adjacent bins whose noisy sum stands out of the noise), one bin wider a side (default
    --box-fraction 0.2: a far cluster of about 490 records a bin is kept for d = 3; see
    docs/data-formats.md), shows the box in `status` and `result`, and opens the boxed study
    with that box in its hashed spec; every later release clips its records into it, and σ's range under
    --scale auto follows it. The box round without its quorum fails the study before anyone
    spends on anything else. The rest, (1 − fraction)·ε, goes to the study as below.

    With --rounds T, the sketch's centroids are refined by T private Lloyd rounds across the
    devices once the sketch is decoded; the devices spend --epsilon in all (the sketch
    (1 − share)·ε, each round share·ε/T), and the result is published after the last round.

    Secure aggregation states its assumptions. Of the L = --min-devices roster, at most
    D = ⌈max-dropout·L⌉ devices drop out and at most C = ⌈max-colluders·L⌉ collude with the
    coordinator. Then: (1) every device adds 1/h_min of one discrete-Laplace draw,
    h_min = L − D − C; the sum is unmasked only over a survivor list of at least L − D masked
    inputs, of which at most C shares are known to the coordinator, so at least h_min unknown
    shares, one full draw, protect the sum (refused if h_min < 1); (2) a coordinator that tells
    a device and some of its neighbours that it survived, and the other neighbours that it
    dropped, could collect both of its secrets and unmask it alone, unless 2t > |N(u)| + 1 +
    colluders among them (|N(u)| = L − 1, or --degree, plus one when the degree and the roster
    are odd); (3) t must be small enough that D dropouts leave t share holders in every
    neighbourhood, so a round within its assumptions finishes; (4) devices reveal shares only
    against q = ⌊(p + C)/2⌋ + 1 signatures on the survivor list from a public committee of
    p = min(L, 2D + C + 1) devices, so the list is unique, which needs L > 2D + C (implied by
    2 and 3); (5) a sparse graph needs --degree > C + D, or a device whose neighbours all
    collude or drop would be read alone. Devices take the enrolled keys from the
    coordinator: against one that deviates, (4) and (5) hold only if the keys are the
    devices' own. The chosen D, C, h_min and t are printed on stderr.

    With --expected-records n, the planner (fedsketch.common.study.forecast) predicts on stderr the
    verdict the published centroids of --min-devices devices of n records each will get ("good",
    "usable, with caveats" or "unreliable"; after the refinement rounds where there are any, from
    the last round's expected noise), with why; the last two are warnings, and with --strict
    refusals."""
    import time
    from dataclasses import replace

    import numpy as np

    from fedsketch.common.secagg.spec import SecAggSpec
    from fedsketch.common.secagg.trust import Assumptions
    from fedsketch.common.sketch.box import Box
    from fedsketch.common.sketch.frequencies import FrequencySpec
    from fedsketch.common.sketch.privacy import PrivacySpec
    from fedsketch.common.sketch.scale import default_range
    from fedsketch.common.sketch.spec import SketchSpec
    from fedsketch.common.study.box_split import PLACEHOLDER_RANGE, split_box, widest
    from fedsketch.common.study.calibration_round import split_auto
    from fedsketch.common.study.sizing import plan_study
    from fedsketch.common.study.study import StudySpec
    from fedsketch.common.study.validated import check_validated
    from fedsketch.server.cli.bounds import asks_auto, parse_bounds
    from fedsketch.server.cli.options import parse_range, parse_scale

    with clean_errors():
        box_plan, rest = None, epsilon
        if asks_auto(bounds):
            box_plan, rest = split_box(epsilon, box_fraction, scale_range is None, round_seconds)
            lo, hi = map(np.array, widest(d))
        else:
            lo, hi = parse_bounds(bounds, d)
        sigma, plan = parse_scale(scale), None
        if sigma is None:
            searched = (parse_range(scale_range, "--scale-range") if scale_range is not None
                        else PLACEHOLDER_RANGE if box_plan is not None else default_range(Box(lo, hi)))
            plan, rest = split_auto(rest, searched, auto_fraction, round_seconds)
            sigma = plan.placeholder
        per_device = None if expected_records is None else check_expected(expected_records)
        planned = plan_study(rest, rounds, per_device, min_devices, d, k, m=m, round_share=round_share,
                             round_seconds=round_seconds,
                             neighbouring=neighbouring, feature=feature, secure=secure_aggregation)
        sketch_eps, refine, size = planned.sketch_epsilon, planned.refine, planned.size
        if m is not None:
            size = None  # given, not planned
        m = planned.m
        sketch = SketchSpec(FrequencySpec(d=d, m=m, scale=sigma, law=law, seed=seed), feature,
                            r, PrivacySpec(sketch_eps, delta, neighbouring))
        secure = None
        given = [flag for flag, value in (("--max-records", max_records),
                                          ("--max-dropout", max_dropout),
                                          ("--max-colluders", max_colluders),
                                          ("--threshold", threshold), ("--degree", degree),
                                          ("--validation", validation))
                 if value is not None]
        if secure_aggregation:
            if max_records is None or max_dropout is None or max_colluders is None:
                raise ValueError("--secure-aggregation needs --max-records, and the assumptions "
                                 "--max-dropout and --max-colluders (fractions of the devices; "
                                 "see --help)")
            secure = SecAggSpec.assuming(
                Assumptions.from_fractions(min_devices, max_dropout, max_colluders), max_records,
                degree, stage_timeout, threshold)
            if validation is not None or helper is not None or helper_ca is not None:
                if validation != "helper" or helper is None or helper_ca is None:
                    raise ValueError("--validation helper takes --helper HOST:PORT and "
                                     "--helper-ca FILE, all three")
                secure = replace(secure, validation="helper", helper=helper,
                                 helper_ca=helper_ca.read_text())
        elif given:
            raise ValueError(f"{', '.join(given)} apply to --secure-aggregation only")
        if secure is None:
            collect_seconds = COLLECT_SECONDS if collect_seconds is None else collect_seconds
            deadline = DEADLINE_SECONDS if deadline is None else deadline
        max_device_records = default_cap(max_device_records, expected_records, secure, min_devices)
        spec = StudySpec.create(name, sketch, k, lo.tolist(), hi.tolist(), roster=roster,
                                collect_seconds=collect_seconds,
                                min_devices=min_devices, min_records=min_records,
                                max_device_records=max_device_records,
                                deadline=None if deadline is None else time.time() + deadline,
                                replicates=replicates, secure_aggregation=secure, refine=refine,
                                calibration=plan, box=box_plan)
        spec.check_new()
        check_validated(spec)
        if size is not None:
            typer.echo(f"m = {m} planned: {size.reason}", err=True)
        if round_share is None and refine is not None and planned.round_share != ROUND_SHARE:
            typer.echo(f"the rounds take {planned.round_share:g} of ε, not {ROUND_SHARE:g}: the sketch "
                       "is planned to show no centroid, so its ε is worth more in the rounds", err=True)
        if box_plan is None:  # the planner needs a box
            report_plan(spec, expected_records, strict)
        typer.echo(largest_weight(spec, expected_records), err=True)
        if refine is not None or plan is not None or box_plan is not None:
            parts = (([f"the box round {box_plan.epsilon:g}"] if box_plan else [])
                     + ([f"round 0 {plan.epsilon:g}"] if plan else []) + [f"the sketch {sketch_eps:g}"])
            if refine is not None:
                parts.append(f"then {rounds} refinement rounds of {refine.epsilon[0]:g}")
            typer.echo(f"ε = {epsilon:g} per device: {', '.join(parts)}", err=True)
        if secure is not None:
            trust = spec.assumptions
            typer.echo(f"secure aggregation: L = {trust.devices}, D = {trust.dropouts}, "
                       f"C = {trust.colluders}, h_min = {trust.min_honest}, "
                       f"t = {secure.threshold}", err=True)
        stub, meta = operator_stub(coordinator, ca, insecure, token_file)
        study = stub.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), metadata=meta,
                                 timeout=30)
    if as_json:
        typer.echo(json.dumps({"study_id": study.study_id, "spec": json.loads(spec.to_json()),
                               "m_plan": None if size is None else size.to_dict()}, allow_nan=False))
        return
    typer.echo(study.study_id)


def default_cap(given: int | None, expected: float | None, secure, devices: int) -> int | None:
    """The study's per-device cap: ``given``, else CAP_HEADROOM × the records expected per
    device (``expected``, else a secure study's max_records / min_devices, at most its
    max_records); None (StudySpec's default) without any expectation."""
    if given is not None:
        return given
    if expected is not None:
        cap = CAP_HEADROOM * math.ceil(check_expected(expected))
    elif secure is not None:
        cap = CAP_HEADROOM * math.ceil(secure.max_records / devices)
    else:
        return None
    return max(1, cap if secure is None else min(cap, secure.max_records))


def largest_weight(spec, expected: float | None) -> str:
    """What create-study says of the largest weight one device can have in the average: the
    count it may declare, and what bounds its input in this kind of study (plain, secure,
    validated: docs/operator-guide.md, "The per-device record cap")."""
    cap, devices = spec.device_cap, spec.min_devices
    text = f"one device may declare at most {cap:,} records (max_device_records)"
    if expected is not None and devices > 1:
        share = cap / (cap + (devices - 1) * expected)
        text += (f": at that count, {share:.1%} of the average against {devices - 1} devices of "
                 f"{expected:,.0f} records each")
    from fedsketch.common.features import ENTRY_L1, GRID

    sa, sketch = spec.secure_aggregation, spec.sketch
    if sa is not None and sa.validation == "helper":
        return text + ("; under secure aggregation its count is checked, and its input is proven "
                       "within that count's range (each entry, and its L1 mass at most its n "
                       "records', plus its noise share's radius) or excluded (validated by the "
                       "helper): it carries at most the cap's weight")
    if sa is not None:
        return text + ("; under secure aggregation its count is checked, its input only through "
                       "the aggregate check, unless --validation helper proves it "
                       "(docs/bounded-influence.md)")
    mass = 2 * sketch.frequencies.m * GRID[sketch.feature] / (sketch.r * ENTRY_L1[sketch.feature])
    return text + (f"; its sketch is checked entry by entry against its count, which lets its "
                   f"L1 mass reach {mass:,.0f}x its n records' (2m·γ/(r·κ)); beyond that only "
                   "the aggregate check bounds the sum (docs/bounded-influence.md)")
