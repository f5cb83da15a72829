"""The trusted-curator comparison behind ``fedsketch compare``: private compressive k-means next
to the centralized mechanisms.

A trusted curator's view: one dataset (a file, or a synthetic set), every method at every ε,
``--trials`` fresh runs each (new noise, same data), and the utility metric of each family's
papers, reported as the median and interquartile range over trials, with the wall time:

* ``kmeans``: relative SSE = SSE(C)/SSE(k-means, k-means++, n_init = 3) (paper 004 Fig. 1);
  methods ``kmeans`` (the reference itself), ``ckm``, ``ckm-quantized`` and ``ckm-lloyd``
  (this project's sketch, alone or refined by private Lloyd steps: :mod:`fedsketch.server.bench.ckm`),
  and the mechanisms of :mod:`fedsketch.server.bench.kmeans`;
* ``pca``: q_F(V) = tr(VᵀAV), A = XᵀX/n of the rows clipped to the norm bound R and divided
  by R (paper 003);
* ``subspace``: the k-means subspace cost (rows clipped to R, divided by R) and the Wasserstein
  subspace distance d_W = min over matchings of √(Σ ‖sin Θ‖_F²) to the true subspaces
  (synthetic data) or to the non-private k-plane solution (a data file) (paper 001).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from fedsketch.common.data.synthetic import SPECTRUM_003, gmm, spectrum, subspaces
from fedsketch.common.study.verdict import UNRELIABLE
from fedsketch.server.bench import kmeans, pca, subspace
from fedsketch.server.bench.ckm import ckm, ckm_lloyd
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.bench.task import Outcome, Task
from fedsketch.server.decode.identify import NOT_IDENTIFIABLE

#: The method registry: each family's methods by CLI name (``ckm`` variants join k-means below).
FAMILIES: dict[str, dict[str, Callable[[Task], Outcome]]] = {
    "kmeans": kmeans.METHODS, "pca": pca.METHODS, "subspace": subspace.METHODS,
}
SYNTHETIC = {"kmeans": "gmm", "pca": "spectrum", "subspace": "subspaces"}
def methods(family: str) -> dict[str, Callable[[Task], Outcome]]:
    """Every method of a family by its CLI name."""
    table = dict(FAMILIES[family])
    if family == "kmeans":
        table["ckm"] = ckm("complex")
        table["ckm-quantized"] = ckm("quantized")
        table["ckm-lloyd"] = ckm_lloyd
    return table


@dataclass(frozen=True)
class Dataset:
    """Records and what the metrics need: ``truth`` (true subspaces) when known."""

    x: np.ndarray
    truth: np.ndarray | None = None


def synthetic(family: str, n: int, d: int, k: int, q: int, noise: float, seed: int) -> Dataset:
    """The family's synthetic set (module docstring of :mod:`fedsketch.common.data.synthetic`)."""
    if family == "kmeans":
        return Dataset(gmm(n, k, d, 2.5, seed)[0].astype(np.float64))
    if family == "pca":
        lam = SPECTRUM_003 if d == len(SPECTRUM_003) else tuple(np.geomspace(0.5, 1e-3, d))
        return Dataset(spectrum(n, lam, seed)[0])
    x, _, bases = subspaces(n, d, k, q, noise, seed)
    return Dataset(x, bases)


@dataclass(frozen=True)
class Row:
    """One (method, ε, metric) cell: median and quartiles over trials, median wall seconds, the
    kind of guarantee the method's outcomes stated (a key of
    :data:`~fedsketch.server.bench.task.GUARANTEES`; several, joined by " / ", if its trials
    differed), how many trials decoded centroids that cannot be told from the sketch's noise
    (``Outcome.status``; 0 for methods without the check), and how many trials' verdicts
    (``Outcome.verdict``, :mod:`fedsketch.common.study.verdict`) were not "good" (``flagged``: a
    private outcome with no verdict counts as flagged, having nothing to vouch for it) and
    how many of those "unreliable"."""

    method: str
    epsilon: float
    metric: str
    median: float
    q1: float
    q3: float
    seconds: float
    guarantee: str
    not_identifiable: int = 0
    flagged: int = 0
    unreliable: int = 0

    def to_dict(self) -> dict:
        """JSON-ready form (the rows of ``fedsketch compare --json``)."""
        return {"method": self.method, "epsilon": self.epsilon, "metric": self.metric,
                "median": self.median, "q1": self.q1, "q3": self.q3, "seconds": self.seconds,
                "guarantee": self.guarantee, "not_identifiable": self.not_identifiable,
                "flagged": self.flagged, "unreliable": self.unreliable}


def flags(out: Outcome) -> tuple[bool, bool]:
    """(flagged, unreliable) of one outcome (:class:`Row`): a verdict other than "good", or a
    private outcome without a verdict; and a verdict of "unreliable"."""
    if out.verdict is None:
        return out.kind != "none", False
    return out.verdict.warns, out.verdict.status == UNRELIABLE


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of ``values`` (numpy's linear interpolation)."""
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return float(med), float(q1), float(q3)


def _metrics(family: str, data: Dataset, task: Task, out: Outcome,
             ref: dict) -> dict[str, float]:
    """The family's utility metrics of one outcome against the precomputed reference ``ref``
    (relative SSE, dimensionless; q_F in units of R²; subspace cost and d_W on rows divided by R)."""
    if family == "kmeans":
        return {"relative_sse": sse_per_n(split(data.x), out.output) / ref["sse"]}
    if family == "pca":
        return {"q_F": pca.q_f(out.output, ref["A"])}
    return {"cost": subspace.subspace_cost(out.output, ref["x"]),
            "d_W": subspace.wasserstein_distance(out.output, ref["truth"])}


def _reference(family: str, data: Dataset, task: Task) -> dict:
    """What the metrics compare against, computed once per dataset."""
    if family == "kmeans":
        sse = sse_per_n(split(data.x), sklearn_kmeans_centroids(data.x, task.k, 0))
        if sse <= 0.0:
            raise ValueError(f"relative SSE is undefined here: k-means with k = {task.k} fits the "
                             "records exactly (no more distinct records than clusters)")
        return {"sse": sse}
    lenient = replace(task, strict=False)  # the metric reads every row; methods obey --strict
    if family == "pca":
        return {"A": pca.second_moment(lenient)[0]}
    x, _ = subspace.prepare(lenient)
    truth = data.truth
    if truth is None:
        truth = subspace.kplane_reference(lenient).output
    return {"x": x, "truth": truth}


def compare(family: str, data: Dataset, base: Task, epsilons: list[float], names: list[str],
            trials: int, progress: Callable[[], None] | None = None) -> list[Row]:
    """Run every method at every ε ``trials`` times; one Row per (method, ε, metric)."""
    table = methods(family)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown {family} method(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(sorted(table))}")
    ref = _reference(family, data, base)
    rows: list[Row] = []
    for name in names:
        reference: list[Row] | None = None  # a non-private reference ignores ε: run it once
        for eps in epsilons:
            if reference is not None:
                rows.extend(replace(r, epsilon=eps) for r in reference)
                if progress is not None:
                    for _ in range(trials):
                        progress()
                continue
            values: dict[str, list[float]] = {}
            seconds = []
            guarantees: dict[str, None] = {}
            flagged = noted = bad = 0
            for _ in range(trials):
                task = replace(base, epsilon=eps)
                t = time.perf_counter()
                out = table[name](task)
                seconds.append(time.perf_counter() - t)
                guarantees[out.kind] = None
                flagged += out.status == NOT_IDENTIFIABLE
                warn, unreliable = flags(out)
                noted += warn
                bad += unreliable
                for metric, value in _metrics(family, data, task, out, ref).items():
                    values.setdefault(metric, []).append(value)
                if progress is not None:
                    progress()
            cell = [Row(name, eps, metric, *_quartiles(vals), statistics.median(seconds),
                        " / ".join(guarantees), flagged, noted, bad) for metric, vals in values.items()]
            rows.extend(cell)
            if out.kind == "none" and math.isinf(out.epsilon):
                reference = cell
    return rows


def plot(rows: list[Row], path: str, title: str) -> None:
    """Utility against ε (log axis), one line per method with its IQR band (one panel per
    metric), as paper 004's Fig. 1, each method labelled with its kind of guarantee (hollow
    markers where it has none); needs matplotlib (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({r.metric for r in rows})
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for method in dict.fromkeys(r.method for r in rows):
            cells = sorted((r.epsilon, r.median, r.q1, r.q3, r.guarantee) for r in rows
                           if r.method == method and r.metric == metric and math.isfinite(r.epsilon))
            if not cells:
                continue
            e, med, q1, q3 = (np.array(v) for v in list(zip(*cells, strict=True))[:4])
            kinds = list(dict.fromkeys(c[4] for c in cells))
            line, = ax.plot(e, med, label=f"{method} [{' / '.join(kinds)}]")
            none = np.array([c[4] == "none" for c in cells])
            ax.plot(e[~none], med[~none], "o", color=line.get_color())
            ax.plot(e[none], med[none], "o", mfc="none", color=line.get_color())
            ax.fill_between(e, q1, q3, alpha=0.2)
        ax.set_xscale("log")
        if metric == "relative_sse":
            ax.set_yscale("log")  # as paper 004's Fig. 1
        ax.set_xlabel("ε")
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n(measured on the records: an evaluation, not a release; hollow "
                 "markers: no privacy guarantee)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
