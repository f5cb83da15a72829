"""``fedsketch simulate``: a real coordinator and L real devices on loopback (the harness is
:mod:`fedsketch.server.sim.simulate`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.choices import (
    BLIND_ROUND_SHARE,
    BOX_ROUND_FRACTION,
    DEFAULT_R,
    FEATURES,
    NEIGHBOURING,
    ROUND_SHARE,
    ROUNDS,
    SECAGG_STAGES,
)
from fedsketch.common.cli import ColumnsOpt, HeaderOpt, JsonOpt, ScaleRangeOpt, open_data
from fedsketch.server.cli.errors import clean_errors, report_verdict


def simulate_command(
    devices: Annotated[int, typer.Option(help="Number of devices L.")] = 20,
    records: Annotated[int | None, typer.Option(
        "--records", "--n",
        help="Total synthetic records N, split over the devices (default: 1000000; with --data, "
             "the file's).")] = None,
    k: Annotated[int, typer.Option(help="Clusters.")] = 10,
    d: Annotated[int | None, typer.Option(
        help="Synthetic dimension (default: 10; with --data, the file's).")] = None,
    data: Annotated[Path | None, typer.Option(
        help="Records (.npy, CSV or Parquet) to split over the devices instead of paper 004's "
             "mixture (docs/REFERENCES.md); needs --bounds and --scale.")] = None,
    header: HeaderOpt = None,
    columns: ColumnsOpt = None,
    bounds: Annotated[str | None, typer.Option(
        help="The study's public box with --data: LO:HI (every axis) or a bounds.json, or "
             "'auto': the study's box round reads it privately (see create-study --help).")] = None,
    box_fraction: Annotated[float, typer.Option(
        help="Share of --epsilon the box round takes with --bounds auto.")] = BOX_ROUND_FRACTION,
    m: Annotated[int | None, typer.Option(
        help="Frequencies. Default: planned from the records per device, L, d, k and the sketch's "
             "share of ε, as `coordinator create-study --expected-records` plans it.")] = None,
    feature: Annotated[str, typer.Option(help=f"{', '.join(FEATURES)}.")] = "complex",
    epsilon: Annotated[float, typer.Option(help="ε per device in all, sketch and refinement "
                                           "rounds (each device's budget; finite, > 0).")] = 1.0,
    rounds: Annotated[int, typer.Option(help="Refinement rounds after the sketch (private Lloyd "
                                        "steps across the devices; sums of offsets from the "
                                        "centres clipped to half the box); 0: the sketch "
                                        "alone.")]
    = ROUNDS,
    round_share: Annotated[float | None, typer.Option(
        help=f"Share of --epsilon the rounds take together (default {ROUND_SHARE:g}; "
             f"{BLIND_ROUND_SHARE:g} when the sketch is planned to show no centroid at all, as "
             "`coordinator create-study` plans it).")] = None,
    delta: Annotated[float, typer.Option(help="δ per device.")] = 0.0,
    neighbouring: Annotated[str, typer.Option(help=f"{' or '.join(NEIGHBOURING)}.")]
    = "replace_one",
    r: Annotated[int, typer.Option(help="Entries per record, 1..m (default 1, as in every "
                                   "command; see `sketch --help`).")] = DEFAULT_R,
    scale: Annotated[str | None, typer.Option(
        help="σ in data units, or 'auto': the study's round 0, a private calibration release "
             "of every device at a tenth of --epsilon, chooses σ as `coordinator create-study "
             "--scale auto` does (default: 2 on the synthetic mixture, whose spread is public; "
             "with --data required).")] = None,
    scale_range: ScaleRangeOpt = None,
    partition: Annotated[str, typer.Option(help="iid or dirichlet:ALPHA.")] = "iid",
    processes: Annotated[bool, typer.Option(help="Real daemon processes, not in-process.")]
    = False,
    backend: Annotated[str, typer.Option(
        help="Who runs the devices: inprocess (this process, the default) or ray (Ray actors, "
             "one per CPU of a local Ray or of the cluster at --address; needs the ray extra: "
             "docs/operator-guide.md).")] = "inprocess",
    address: Annotated[str | None, typer.Option(
        help="A Ray cluster's address for --backend ray (e.g. auto, or HOST:6379); default: a "
             "local Ray on this machine's cores.")] = None,
    replicates: Annotated[int, typer.Option(help="CL-OMPR replicates.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the data and of Ω.")] = 0,
    secure_aggregation: Annotated[bool, typer.Option(
        "--secure-aggregation", help="Secure aggregation with distributed DLap noise "
        "(pure ε, replace-one).")] = False,
    threshold: Annotated[int | None, typer.Option(help="Shamir threshold t (default: the "
                                                  "smallest safe one).")] = None,
    max_dropout: Annotated[float | None, typer.Option(
        help="Fraction of devices the study assumes may drop out (default: --dropout); see "
        "`coordinator create-study --help`.")] = None,
    max_colluders: Annotated[float, typer.Option(
        help="Fraction of devices the study assumes may collude with the coordinator.")] = 0.0,
    degree: Annotated[int | None, typer.Option(help="Neighbours per device (sparse SecAgg+ "
                                               "graph; default: everyone).")] = None,
    stage_timeout: Annotated[float | None, typer.Option(
        help="Seconds before a stage proceeds without silent devices (default: max(30, 2·L), "
        "sized from measured stage costs: docs/secure-aggregation.md).")] = None,
    dropout: Annotated[float, typer.Option(help="Fraction of devices that go silent.")] = 0.0,
    dropout_stage: Annotated[str, typer.Option(help=f"Where they go silent: "
                                               f"{', '.join(SECAGG_STAGES)}.")]
    = "masked_input",
    hostile: Annotated[str | None, typer.Option(
        help="K:KIND makes the last K devices hostile, KIND one of inflate (an input worth "
             "100x its declared records at one point), random (uniform words), replay (another "
             "device's input), overclaim (the cap's record count); the report says what the "
             "defences did (docs/bounded-influence.md). In-process devices only.")] = None,
    validation: Annotated[str | None, typer.Option(
        help="'helper' (with --secure-aggregation): every input is proven in range and checked "
             "by the coordinator and a helper process started here like the coordinator "
             "(docs/bounded-influence.md); the report's \"validation\" counts what was "
             "excluded.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Simulate a federated study: real coordinator, L real devices, loopback gRPC over TLS.

    The records are paper 004's mixture (docs/REFERENCES.md), or a data file of yours (--data,
    with the public box --bounds and the scale --scale), dealt out to the devices by
    --partition."""
    from fedsketch.server.cli.bounds import asks_auto, parse_bounds
    from fedsketch.server.cli.options import parse_range, parse_scale
    from fedsketch.server.sim.config import SimConfig

    with clean_errors():  # the arguments, before the simulator (grpc, the coordinator) loads
        pooled, box, source = None, None, None
        if data is None:
            if bounds is not None:
                raise ValueError("--bounds sets the box of a --data file; the synthetic mixture's "
                                 "box is fixed")
            records, d = 1_000_000 if records is None else records, 10 if d is None else d
            scale = "2" if scale is None else scale
        else:
            if bounds is None:
                raise ValueError("--data needs the study's public box: --bounds LO:HI")
            if records is not None or d is not None:
                raise ValueError("--records and --d come from the --data file; drop them")
            source = open_data(data, header, columns)
            if scale is None:
                raise ValueError("--data needs the study's public scale --scale σ (data units; "
                                 "see --help)")
            if asks_auto(bounds):
                from fedsketch.common.study.box_split import check_split

                check_split(epsilon, box_fraction)
    from fedsketch.server.sim.simulate import EXPECTED_ERRORS, file_data, run_simulation

    with clean_errors(*EXPECTED_ERRORS):
        if source is not None:
            pooled = file_data(source, k, seed)
            records, d = pooled.x.shape
            if not asks_auto(bounds):  # auto: the study's box round
                lo, hi = parse_bounds(bounds, d)
                box = (tuple(map(float, lo)), tuple(map(float, hi)))
        sigma = parse_scale(scale)  # None: auto
        searched = None if scale_range is None else parse_range(scale_range, "--scale-range")
    cfg = SimConfig(devices=devices, records=records, k=k, d=d, m=m, feature=feature,
                    epsilon=epsilon, delta=delta, neighbouring=neighbouring, r=r, scale=sigma,
                    partition=partition, processes=processes, replicates=replicates, seed=seed,
                    secure_aggregation=secure_aggregation, threshold=threshold,
                    max_dropout=max_dropout, max_colluders=max_colluders, degree=degree,
                    stage_timeout=stage_timeout,
                    dropout=dropout, dropout_stage=dropout_stage, box=box, rounds=rounds,
                    round_share=round_share, scale_range=searched, hostile=hostile,
                    backend=backend, address=address, validation=validation,
                    auto_box=bounds == "auto" and box is None, box_fraction=box_fraction)
    with clean_errors(RuntimeError, *EXPECTED_ERRORS):  # RuntimeError: a device refused or the study failed
        report = run_simulation(cfg, pooled)
    if as_json:
        typer.echo(json.dumps(report))
        return
    if report["relative_sse"] is None:  # a hostile run whose study failed: nothing published
        typer.echo(f"the study failed, nothing was published: {report['hostile']['study_failed']}")
        return
    from rich.console import Console  # rich loads here, not when the CLI starts
    from rich.table import Table

    from fedsketch.server.bench.metrics import RELATIVE_SSE_MEANING

    table = Table(title=f"{cfg.devices} devices, {cfg.records:,} records, k = {cfg.k}, "
                        f"d = {cfg.d}, m = {report['config']['m']}"
                        f"{' (planned)' if cfg.m is None else ''}, {cfg.feature}, "
                        f"ε = {cfg.epsilon:g} per device")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("relative SSE vs k-means (n_init = 3)", f"{report['relative_sse']:.4f}")
    table.add_row("verdict on the centroids", report["verdict"]["status"] if report["verdict"] else "-")
    if (made := report["box"]) is not None:
        table.add_row("box round", made["explanation"])
    if (cal := report["calibration"]) is not None:
        table.add_row("round 0 (σ calibration)", cal["explanation"])
    if (ref := report["refinement"]) is not None:
        table.add_row("relative SSE of the sketch's start", f"{ref['start_relative_sse']:.4f}")
        table.add_row("refinement rounds that ended with new centres",
                      f"{ref['refined_rounds']} of {ref['rounds']}")
    for phase, sec in report["seconds"].items():
        table.add_row(f"seconds: {phase}", f"{sec:.2f}")
    if (on_ray := report["ray"]) is not None:
        table.add_row("Ray actors; growth of the peak resident set per device",
                      f"{on_ray['actors']}; {on_ray['rss_growth_per_device_bytes'] / 1024:,.0f} KiB")
    if report["bytes_sent"] is not None:
        table.add_row("bytes sent by the devices", f"{report['bytes_sent']:,}")
    if report["bytes_received"] is not None and report["secure_aggregation"] is not None:
        table.add_row("bytes routed to the devices", f"{report['bytes_received']:,}")
    if (bad := report["hostile"]) is not None:
        table.add_row(f"hostile devices ({bad['kind']}): the defence", bad["defence"])
    if (sa := report["secure_aggregation"]) is not None:
        table.add_row("secure aggregation: assumed D, C; h_min, t",
                      f"{sa['dropouts']}, {sa['colluders']}; {sa['min_honest']}, {sa['threshold']}")
        for stage, closing in sa["stage_seconds"].items():  # each stage the round ran
            opened = sa["stage_open_seconds"].get(stage, math.nan)
            table.add_row(f"coordinator at {stage}: CPU s; open s; closing s",
                          f"{sa['stage_cpu_seconds'].get(stage, 0.0):.3f}; {opened:.2f}; {closing:.3f}")
    def show() -> None:
        Console().print(table)
        typer.echo(RELATIVE_SSE_MEANING)

    report_verdict(report["verdict"], False, show)
