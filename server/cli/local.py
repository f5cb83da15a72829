"""The commands on local files: synthetic data (``synth``), private sketching (``sketch``),
decoding (``decode``) and evaluation (``evaluate``). The ``fedsketch`` command itself is
assembled in :mod:`fedsketch.cli`.

Every command reports bad input as one line on stderr (``error: ...``) with exit status 1 and
writes no partial output file. ``--quiet`` turns progress bars off.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedsketch.common.choices import DEFAULT_R, FEATURES, LAWS, NEIGHBOURING, UNPLANNED_M
from fedsketch.common.cli import ColumnsOpt, HeaderOpt, JsonOpt, ScaleRangeOpt, open_data
from fedsketch.common.helptext import TidyGroup
from fedsketch.server.cli.errors import NOT_IDENTIFIABLE_EXIT, clean_errors, report_verdict
from fedsketch.server.cli.options import parse_range, parse_scale

if TYPE_CHECKING:  # numpy, scipy and the mechanisms load inside the commands that use them
    import numpy as np
    from rich.console import Console
    from rich.progress import Progress

synth_app = typer.Typer(cls=TidyGroup, no_args_is_help=True, help="Generate synthetic datasets.")


@cache
def err() -> Console:
    """The command's one rich console on stderr, for its lines and its progress bars (rich loads
    on first use, not when the CLI starts)."""
    from rich.console import Console

    return Console(stderr=True)


Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


def progress_bar(quiet: bool) -> Progress:
    """A rich progress bar on stderr, disabled by ``quiet``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
        TimeRemainingColumn(),
        console=err(),
        disable=quiet,
        transient=True,
    )


def check_output(path: Path) -> Path:
    """Refuse an output path that is a folder or whose folder does not exist (before any work)."""
    if path.is_dir():
        raise ValueError(f"{path}: a folder; give the name of the file to write")
    if not path.parent.exists():
        raise ValueError(f"{path}: folder {path.parent} does not exist")
    return path


@synth_app.command("gmm")
def synth_gmm(
    out: Annotated[Path, typer.Option(help="Output .npy file of float32 records (n, d).")],
    n: Annotated[int, typer.Option("--n", "--records", help="Number of records.")] = 100_000,
    k: Annotated[int, typer.Option(help="Number of clusters.")] = 10,
    d: Annotated[int, typer.Option(help="Dimension.")] = 10,
    separation: Annotated[float, typer.Option(help="s: centres ~ N(0, (s·k^(1/d))² I).")] = 2.5,
    seed: Annotated[int, typer.Option(help="Seed of the data generator.")] = 0,
    labels: Annotated[Path | None, typer.Option(help="Also write int32 labels here (.npy).")] = None,
    quiet: Quiet = False,
    as_json: JsonOpt = False,
) -> None:
    """Gaussian mixture of paper 004 (docs/REFERENCES.md): k unit-covariance clusters of equal
    weight."""
    import numpy as np

    from fedsketch.common.data.dataio import write_npy_stream
    from fedsketch.common.data.synthetic import gmm_chunks

    with clean_errors():
        check_output(out)
        if labels is not None:
            check_output(labels)
        centres, chunks = gmm_chunks(n, k, d, separation, seed)
        all_labels: list[np.ndarray] = []

        def records() -> Iterator[np.ndarray]:
            with progress_bar(quiet) as bar:
                task = bar.add_task("generating", total=n)
                for x, lab in chunks:
                    if labels is not None:
                        all_labels.append(lab)
                    bar.advance(task, x.shape[0])
                    yield x

        write_npy_stream(out, n, d, records())
        if labels is not None:
            np.save(labels, np.concatenate(all_labels))
        err().print(f"wrote {out}: {n:,} records, d = {d}, k = {k}, separation {separation}")
    if as_json:
        typer.echo(json.dumps({"out": str(out), "labels": None if labels is None else str(labels),
                               "n": n, "d": d, "k": k, "separation": separation, "seed": seed,
                               "centres": centres.tolist()}))


def sketch(
    data: Annotated[Path, typer.Argument(
        help="Records, one a row: .npy (2-D, any order), .csv or .parquet; with --engine dask, a "
             "folder of Parquet files (one partition each).")],
    out: Annotated[Path, typer.Option(help="Output sketch file (.npz).")],
    m: Annotated[int | None, typer.Option(
        help="Number of frequencies (complex sketch entries). Default: planned from n, d, --k and "
             "ε (the largest of 10, 5, 2, 1 ·k·d whose predicted signal clears the decoder's "
             "threshold, else 10·k·d; m·d·k at most 4·10⁵); without --k, 1000.")] = None,
    k: Annotated[int | None, typer.Option(
        help="Clusters you will decode (decode --k): plans m when --m is not given. Under "
             "add-remove the plan reads a noisy count at 2% of ε.")] = None,
    feature: Annotated[str, typer.Option(help=f"Feature map: {', '.join(FEATURES)}.")] = "complex",
    law: Annotated[str, typer.Option(help=f"Frequency radius law: {', '.join(LAWS)}.")] = (
        "adapted_radius"
    ),
    scale: Annotated[str, typer.Option(help="σ in data units, or 'auto' (private).")] = "auto",
    seed: Annotated[int, typer.Option(help="Public seed of Ω and ξ.")] = 0,
    r: Annotated[int, typer.Option(
        help="Entries per record, 1..m (default 1 in every command: at n = 10^7 paper 004, "
             "docs/REFERENCES.md, finds r = 1 as accurate as r = m, at 1/m of the work; --r M "
             "for every entry).")] = DEFAULT_R,
    epsilon: Annotated[str, typer.Option(help="Total ε > 0, or 'inf' for no noise.")] = "1.0",
    delta: Annotated[float, typer.Option(help="δ; > 0 selects the discrete Gaussian.")] = 0.0,
    neighbouring: Annotated[str, typer.Option(help=f"{' or '.join(NEIGHBOURING)}.")] = (
        "replace_one"
    ),
    dither: Annotated[bool, typer.Option(help="Random public dither ξ.")] = True,
    bounds: Annotated[str | None, typer.Option(
        help="Public box LO:HI (every axis) or a bounds.json; records outside are clipped into it "
             "(default ±2^40 on every axis, which only keeps phases finite). 'auto': a private "
             "box read from the records at --box-fraction of ε (at ε = inf their own range), "
             "stored in the sketch file for decode.")] = None,
    auto_fraction: Annotated[float, typer.Option(help="Share of ε spent by --scale auto.")] = 0.1,
    box_fraction: Annotated[float, typer.Option(help="Share of ε spent by --bounds auto.")] = 0.1,
    scale_range: ScaleRangeOpt = None,
    header: HeaderOpt = None,
    columns: ColumnsOpt = None,
    engine: Annotated[str, typer.Option(
        help="Where the feature sum is computed: local (this process) or dask (each Parquet "
             "partition's exact integer sum on a Dask worker, added and noised once here; "
             "the dask extra).")] = "local",
    scheduler: Annotated[str | None, typer.Option(
        help="With --engine dask: the Dask scheduler's address (tcp://HOST:8786); default a "
             "local cluster of one worker per core.")] = None,
    quiet: Quiet = False,
    as_json: JsonOpt = False,
) -> None:
    """Sketch DATA into OUT: the feature sum Σ f(Ωᵀx+ξ) encoded as integers, plus exact integer
    noise (s = that sum/(n√m) is the sketch), with its spec.

    With --scale auto, a private calibration release spends --auto-fraction of ε first and the
    main sketch spends the rest (sequential composition); the picked σ is printed and stored.
    Every record is first clipped into the public box (--bounds); how many were clipped is
    printed here and stored nowhere. A NaN or an infinity in DATA stops the command before any
    noise is drawn.
    """
    from fedsketch.common.sketch.box import Box, Tally
    from fedsketch.common.sketch.dataset_sketch import SketchPlan
    from fedsketch.common.sketch.privacy import PrivacySpec
    from fedsketch.common.sketch.private_box import PrivateBox
    from fedsketch.common.study.sizing import size_for_sketch
    from fedsketch.server.cli.bounds import parse_bounds

    with clean_errors():
        check_output(out)
        try:
            eps_total = float(epsilon)
        except ValueError:
            raise ValueError(f"--epsilon must be a number > 0 or 'inf', got {epsilon!r}") from None
        sigma = parse_scale(scale)
        if sigma is None and bounds is None and scale_range is None:
            raise ValueError("--scale auto needs --bounds (σ's search range follows the public "
                             "box; --bounds auto reads one privately) or --scale-range LO:HI in "
                             "data units")
        plan = SketchPlan(PrivacySpec(eps_total, delta, neighbouring), m=UNPLANNED_M if m is None else m,
                          feature=feature, law=law, scale=sigma, seed=seed, r=r, dither=dither,
                          auto_fraction=auto_fraction, box_fraction=box_fraction,
                          scale_range=None if scale_range is None
                          else parse_range(scale_range, "--scale-range"))
        source = open_data(data, header, columns, engine=engine, scheduler=scheduler)  # before any spend
        box = (Box.widest(source.d) if bounds is None else None if bounds == "auto"
               else Box(*parse_bounds(bounds, source.d)))
        size = None
        if m is None and k is not None:  # the last check above: the plan may spend on a count
            reads = (box_fraction if bounds == "auto" else 0.0) + (auto_fraction if sigma is None else 0.0)
            rest, size = size_for_sketch(source.n, source.d, k, eps_total, neighbouring=neighbouring,
                                         feature=feature, reads=reads)
            plan = replace(plan, m=size.m, privacy=PrivacySpec(rest, delta, neighbouring))
            spent = "" if rest == eps_total else f" (its noisy count spent ε = {eps_total - rest:.4g})"
            err().print(f"m = {size.m} planned for k = {k}{spent}: {size.reason}")
        tally = Tally()
        with progress_bar(quiet) as bar:
            task = bar.add_task("sketching", total=source.n)
            made = plan.run(source.chunks, box, d=source.d, tally=tally,
                            progress=lambda rows: bar.advance(task, rows))
        if isinstance(made.box, PrivateBox):
            err().print(f"bounds auto: {made.box.explanation}")
        if made.calibration is not None:
            cal = made.calibration
            advice = cal.advice('--scale σ', '--bounds', '--scale-range')
            err().print(f"scale auto: {cal.explanation}{advice} "
                        f"(spent ε = {cal.epsilon:.4g} of {eps_total:.4g})")
        written = made.to_file()
        if size is not None and rest < eps_total:  # the plan's noisy count, spent too
            written = replace(written, epsilon_spent=written.epsilon_spent + eps_total - rest)
        written.save(out)
        release = made.release
        noise = ", ".join(f"{t.law}({t.scale:.3g}) on {t.target}" for t in release.noise)
        count = (f"n = {release.n:,}" if neighbouring == "replace_one"
                 else f"noisy n = {release.n:,} (the released count)")
        err().print(f"wrote {out}: {count}, m = {plan.m}, r = {made.spec.r}, noise: {noise or 'none'}")
        if tally.clipped:
            err().print(f"note: {tally.clipped:,} of {tally.records:,} records lay outside the box "
                      "and were clipped into it (this count is not private; it is not stored)")
    if as_json:
        typer.echo(json.dumps({
            "out": str(out), "n": release.n, "neighbouring": neighbouring, "m": plan.m, "r": made.spec.r,
            "plan": None if size is None else size.to_dict(),
            "scale": made.spec.frequencies.scale, "delta": delta,
            "epsilon": eps_total if math.isfinite(eps_total) else "inf",
            "calibration": None if made.calibration is None else made.calibration.to_dict(),
            "box": made.box_dict(),
            "noise": [{"law": t.law, "scale": t.scale, "target": t.target} for t in release.noise],
            "clipped": tally.clipped}, allow_nan=False))


def decode(
    sketch_file: Annotated[Path, typer.Argument(metavar="SKETCH", help="A sketch file (.npz).")],
    k: Annotated[int, typer.Option(help="Number of centroids.")],
    bounds: Annotated[str | None, typer.Option(
        help="Public box: LO:HI (every axis) or a bounds.json (default: the box the sketch file "
             "holds, read by sketch --bounds auto).")] = None,
    replicates: Annotated[int, typer.Option(help="CL-OMPR runs; the lowest residual wins.")] = 3,
    seed: Annotated[int | None, typer.Option(help="Seed of the decoder's random starts.")] = None,
    as_json: JsonOpt = False,
    strict: Annotated[bool, typer.Option(
        help=f"Exit with status {NOT_IDENTIFIABLE_EXIT} when the verdict on the centroids is "
             "\"unreliable\".")] = False,
    quiet: Quiet = False,
) -> None:
    """Decode k centroids and weights from a sketch with CL-OMPR (never reads data).

    The sketch's noise is known from its public spec and released count. The centroids get one
    verdict ("good", "usable, with caveats" or "unreliable"; in the JSON as "verdict", with its
    reason also on stderr unless good) from how much of the sketch's signal they leave unexplained
    beyond that noise; --strict makes "unreliable" an error. "identifiability" keeps, as a detail,
    each centroid's weight in noise standard deviations against what noise alone gives an atom."""
    import numpy as np

    from fedsketch.common.sketch.sketchfile import load_sketch
    from fedsketch.server.cli.bounds import parse_bounds
    from fedsketch.server.decode.pipeline import decode_judged

    with clean_errors():
        loaded = load_sketch(sketch_file)
        if bounds is not None:
            lo, hi = parse_bounds(bounds, loaded.spec.frequencies.d)
        elif (stored := loaded.stored_box()) is not None:
            lo, hi = stored.lo, stored.hi
        else:
            raise ValueError(f"{sketch_file} holds no box (only sketch --bounds auto stores one): "
                             "give the box it was sketched in with --bounds")
        loaded.check_frequencies(str(sketch_file))
        with progress_bar(quiet) as bar:
            task = bar.add_task("decoding", total=replicates * 2 * k)
            result = decode_judged(loaded.sketch, loaded.spec, k, lo, hi, records=loaded.n,
                                   replicates=replicates, rng=np.random.default_rng(seed),
                                   progress=lambda done, total: bar.update(task, completed=done))
    out = result.to_dict()
    report_verdict(out["verdict"], strict, lambda: _show_decoding(out, as_json))


def _show_decoding(out: dict, as_json: bool) -> None:
    """``decode``'s output: the JSON object, or a table by decreasing weight."""
    if as_json:
        typer.echo(json.dumps(out))
        return
    k = len(out["weights"])
    title = f"{k} centroids (sketch residual {out['residual']:.4g}; {out['verdict']['status']})"
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("weight", justify="right")
    table.add_column("centroid")
    for w, c in sorted(zip(out["weights"], out["centroids"], strict=True), key=lambda t: -t[0]):
        table.add_row(f"{w:.3f}", " ".join(f"{v:+.3f}" for v in c))
    Console().print(table)


def read_centroids(path: Path) -> np.ndarray:
    """Centroids from JSON: ``{"centroids": [[...]]}`` (as ``decode --json`` writes) or a list."""
    import numpy as np

    try:
        obj = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"--centroids {path}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if isinstance(obj, dict) and "centroids" not in obj:
        raise ValueError(f"{path}: no 'centroids' in this JSON object (give the JSON of decode --json, "
                         "coordinator result or simulate --json)")
    rows = obj.get("centroids") if isinstance(obj, dict) else obj
    try:
        c = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: centroids must be a list of equal-length number lists") from None
    if c.ndim != 2 or c.shape[0] == 0:
        raise ValueError(f"{path}: centroids must be a non-empty list of lists, got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"{path}: centroids contain NaN or inf")
    return c


def evaluate(
    data: Annotated[Path, typer.Option(help="Records (.npy, .csv or .parquet).")],
    centroids: Annotated[Path, typer.Option(help="Centroids JSON (e.g. decode --json output).")],
    seed: Annotated[int, typer.Option(help="Seed of the k-means reference.")] = 0,
    header: HeaderOpt = None,
    columns: ColumnsOpt = None,
    as_json: JsonOpt = False,
    quiet: Quiet = False,
) -> None:
    """SSE/n of CENTROIDS on DATA, and relative SSE against k-means (k-means++, n_init = 3).
    The progress bar counts the records read: one pass for the SSE, one to load them for
    k-means."""
    from fedsketch.server.bench.metrics import evaluate_centroids

    with clean_errors():
        c = read_centroids(centroids)
        source = open_data(data, header, columns)
        if source.d != c.shape[1]:
            raise ValueError(f"centroids have dimension {c.shape[1]}, {data} has {source.d}")
        with progress_bar(quiet) as bar:
            task = bar.add_task("reading", total=2 * source.n)

            def counted() -> Iterator[np.ndarray]:
                for x in source.chunks():
                    bar.advance(task, x.shape[0])
                    yield x

            out = evaluate_centroids(counted, c, seed).to_dict()
    if as_json:
        typer.echo(json.dumps(out))
        return
    line = f"SSE/n = {out['sse_per_n']:.6g}"
    if out["kmeans_sse_per_n"] is not None:
        line += (f"   k-means SSE/n = {out['kmeans_sse_per_n']:.6g}   "
                 f"relative SSE = {out['relative_sse']:.4f}")
    else:
        line += "   (install scikit-learn for the k-means reference)"
    typer.echo(line)


