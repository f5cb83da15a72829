"""``fedsketch compare``: every method of a family at every ε on one dataset (the bench's
logic is :mod:`fedsketch.server.bench.compare`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedsketch.common.cli import ColumnsOpt, HeaderOpt, JsonOpt, open_data
from fedsketch.server.cli.errors import clean_errors


def _parse_epsilons(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--epsilons must be a comma-separated list of numbers, got {text!r}") \
            from None
    if not values or not all(v > 0 for v in values):
        raise ValueError(f"every ε must be > 0, got {text!r}")
    return values


def compare_command(
    family: Annotated[str, typer.Argument(help="kmeans, pca or subspace.")],
    data: Annotated[Path | None, typer.Option(help="Records (.npy, .csv or .parquet).")] = None,
    synthetic_set: Annotated[str | None, typer.Option(
        "--synthetic", help="gmm (kmeans), spectrum (pca) or subspaces (subspace).")] = None,
    n: Annotated[int, typer.Option("--n", "--records", help="Synthetic records.")] = 100_000,
    d: Annotated[int, typer.Option(help="Synthetic dimension.")] = 10,
    k: Annotated[int, typer.Option(help="Clusters, PCA rank or subspaces.")] = 10,
    q: Annotated[int, typer.Option(help="Subspace dimension (subspace).")] = 3,
    noise: Annotated[float, typer.Option(help="Noise σ of the subspaces set.")] = 0.1,
    epsilons: Annotated[str, typer.Option(help="Comma-separated ε values.")] = "0.01,0.1,1",
    method_list: Annotated[str | None, typer.Option(
        "--methods", help="Comma-separated methods (default: all of the family).")] = None,
    trials: Annotated[int, typer.Option(help="Runs per method and ε.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the data and of non-private randomness.")]
    = 0,
    delta: Annotated[float, typer.Option(help="δ of approximate mechanisms, in (0, 1).")] = 1e-6,
    bounds: Annotated[str | None, typer.Option(help="Public box LO:HI or bounds.json (kmeans; "
                                               "a default is derived for --synthetic gmm).")]
    = None,
    norm_bound: Annotated[float, typer.Option(help="Public bound on ‖x‖ (pca, subspace).")]
    = 1.0,
    neighbouring: Annotated[str, typer.Option(help="replace_one or add_remove.")] = "replace_one",
    strict: Annotated[bool, typer.Option(help="Refuse rows outside the public bound instead "
                                         "of clipping them.")] = False,
    as_json: JsonOpt = False,
    plot_path: Annotated[Path | None, typer.Option("--plot", help="Write a PNG plot here.")]
    = None,
    header: HeaderOpt = None,
    columns: ColumnsOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Every method at every ε on one dataset: median [IQR] of the family's utility metric."""
    # the bench (every mechanism family) loads only when compare runs, not at CLI start-up
    import numpy as np
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from fedsketch.common.data.dataio import load_all
    from fedsketch.server.bench.compare import (
        FAMILIES,
        SYNTHETIC,
        Dataset,
        compare,
        methods,
        plot,
        synthetic,
    )
    from fedsketch.server.bench.task import Task, clip_rows_to_box, clip_rows_to_norm
    from fedsketch.server.cli.bounds import parse_bounds

    with clean_errors():
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; choose kmeans, pca or subspace")
        if (data is None) == (synthetic_set is None):
            raise ValueError("give exactly one of --data and --synthetic")
        if synthetic_set is not None and synthetic_set != SYNTHETIC[family]:
            raise ValueError(f"the {family} family's synthetic set is {SYNTHETIC[family]!r}, "
                             f"got {synthetic_set!r}")
        eps_list = _parse_epsilons(epsilons)
        if trials < 1:
            raise ValueError(f"--trials must be >= 1, got {trials}")
        if data is not None:
            dataset = Dataset(load_all(open_data(data, header, columns)).astype(np.float64))
        else:
            dataset = synthetic(family, n, d, k, q, noise, seed)
        dim = dataset.x.shape[1]
        if family == "subspace" and not 1 <= q < dim:
            raise ValueError(f"need 1 <= q < d, got q = {q}, d = {dim}")
        lo = hi = None
        if family == "kmeans":
            if bounds is None:
                if data is not None:
                    raise ValueError("kmeans on a data file needs a public box: --bounds LO:HI")
                half = 4 * 2.5 * k ** (1 / dim) + 3
                bounds = f"{-half}:{half}"
            lo, hi = parse_bounds(bounds, dim)
        if family == "kmeans":
            _, clipped = clip_rows_to_box(dataset.x, lo, hi, strict)
        else:
            _, clipped = clip_rows_to_norm(dataset.x, norm_bound, strict)
        if clipped:
            typer.echo(f"note (a non-private operator diagnostic, not part of any release): "
                       f"{clipped} of {dataset.x.shape[0]} rows lie outside the public bound; the "
                       "mechanisms clip them onto it (--strict refuses them)", err=True)
        names = method_list.split(",") if method_list else list(methods(family))
        base = Task(dataset.x, k, eps_list[0], delta, lo, hi, norm_bound, q, neighbouring,
                    strict, np.random.default_rng(seed))
        with Progress(console=Console(stderr=True), disable=quiet, transient=True) as bar:
            job = bar.add_task("trials", total=len(names) * len(eps_list) * trials)
            rows = compare(family, dataset, base, eps_list, names, trials,
                           progress=lambda: bar.advance(job))
        if plot_path is not None:
            plot(rows, str(plot_path), f"{family}: n = {dataset.x.shape[0]:,}, d = {dim}, "
                                       f"k = {k}, {trials} trials")
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows]))
        return
    table = Table(title=escape(f"{family}: median [q1, q3] over {trials} trials"), box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    table.add_column("method", no_wrap=True, min_width=max(len(r.method) for r in rows))
    table.add_column("ε", no_wrap=True)
    table.add_column("metric")
    for col in ("median", "IQR", "seconds"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(r.method, f"{r.epsilon:g}", r.metric, f"{r.median:.4g}",
                      escape(f"[{r.q1:.4g}, {r.q3:.4g}]"), f"{r.seconds:.2f}")
    console = Console()
    console.print(table)
    for line in guarantee_lines(rows) + noise_lines(rows, trials):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print("The metrics and times are measured on the records themselves: an evaluation "
                  "for the curator, not a private release.", highlight=False, markup=False)


def noise_lines(rows: list, trials: int) -> list[str]:
    """One line per (method, ε) whose trials' verdicts were not "good" (``Row.flagged``, of which
    ``Row.unreliable`` "unreliable"; :mod:`fedsketch.common.study.verdict`): those medians come
    with a warning, whatever the method."""
    seen = {(r.method, r.epsilon, r.flagged, r.unreliable) for r in rows if r.flagged}
    return [f"warning: {method} at ε = {eps:g}: {count} of {trials} trials not judged good "
            f"({bad} unreliable; the verdict reads only what the method released: see --json)"
            for method, eps, count, bad in sorted(seen)]


def guarantee_lines(rows: list) -> list[str]:
    """What each method guarantees, one line per kind (:data:`~fedsketch.server.bench.task.GUARANTEES`):
    "guarantee <kind> (<words>): <methods>", a method named with its ε values when its kind
    depends on ε (sample-and-aggregate outside Theorem 3.1's conditions)."""
    from fedsketch.server.bench.task import GUARANTEES

    by_method: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        eps = by_method.setdefault(r.method, {}).setdefault(r.guarantee, [])
        if f"{r.epsilon:g}" not in eps:
            eps.append(f"{r.epsilon:g}")
    by_kind: dict[str, list[str]] = {}
    for method, kinds in by_method.items():
        for kind, eps in kinds.items():
            name = method if len(kinds) == 1 else f"{method} (ε = {', '.join(eps)})"
            by_kind.setdefault(kind, []).append(name)
    return [f"guarantee {kind} ({' / '.join(GUARANTEES[k] for k in kind.split(' / '))}): "
            f"{', '.join(names)}" for kind, names in by_kind.items()]
