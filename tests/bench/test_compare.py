"""``fedsketch compare``: small end-to-end runs of each family, the JSON rows, the plot, and
one-line refusals of bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fedsketch.cli import app

#: Seeded outcomes here depend on floating-point summation order (BLAS kernels): tests/test_blas_kernels.py
#: re-runs this module under each OpenBLAS kernel the CPU offers.
pytestmark = pytest.mark.blas


runner = CliRunner()
ROW_KEYS = {"method", "epsilon", "metric", "median", "q1", "q3", "seconds", "guarantee",
            "not_identifiable", "flagged", "unreliable"}
#: Each method's kind of guarantee (server/bench/task.py GUARANTEES).
KINDS = {"kmeans": "none", "ckm": "pure", "ckm-quantized": "pure", "ckm-lloyd": "pure", "dplloyd": "pure",
         "dplloyd-su": "pure", "dplloyd-su-overseed": "pure", "white": "local-sensitivity",
         "colored": "local-sensitivity", "pca": "none", "random": "none", "mod-sulq": "approximate",
         "ppca": "asymptotic-mcmc", "kplane": "none", "sulq-kplane": "approximate",
         "gibbs": "asymptotic-mcmc"}


def run_json(*args: str) -> list[dict]:
    res = runner.invoke(app, ["compare", *args, "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.slow
def test_kmeans_family_rows_and_plot(tmp_path):
    png = tmp_path / "k.png"
    rows = run_json("kmeans", "--synthetic", "gmm", "--n", "60000", "--d", "3", "--k", "3",
                    "--epsilons", "0.5,5", "--trials", "3", "--plot", str(png))
    assert all(set(r) == ROW_KEYS for r in rows)
    got = {(r["method"], r["epsilon"]) for r in rows}
    names = {"kmeans", "ckm", "ckm-quantized", "ckm-lloyd", "dplloyd", "dplloyd-su", "dplloyd-su-overseed",
             "white", "colored"}
    assert got == {(m, e) for m in names for e in (0.5, 5.0)}
    assert all(r["guarantee"] == KINDS[r["method"]] for r in rows)
    by = {(r["method"], r["epsilon"]): r for r in rows}
    assert by[("kmeans", 5.0)]["median"] == pytest.approx(1.0, abs=0.02)
    assert all(r["q1"] <= r["median"] <= r["q3"] for r in rows)
    assert by[("ckm", 5.0)]["median"] < 1.3 and by[("dplloyd-su", 5.0)]["median"] < 1.3
    assert by[("dplloyd-su-overseed", 5.0)]["median"] < 1.3
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_pca_family_orders_the_methods():
    rows = run_json("pca", "--synthetic", "spectrum", "--n", "5000", "--d", "10", "--k", "2",
                    "--epsilons", "2", "--trials", "2", "--methods", "pca,random,mod-sulq")
    med = {r["method"]: r["median"] for r in rows if r["metric"] == "q_F"}
    assert med["pca"] >= med["mod-sulq"] > med["random"]
    assert all(r["guarantee"] == KINDS[r["method"]] for r in rows)


def test_table_shows_the_title_and_every_method_in_full(monkeypatch):
    """The rich table escapes its brackets (not markup) and truncates no method or metric name
    at the default width of 80 columns (what a pipe gets)."""
    monkeypatch.setenv("COLUMNS", "80")
    res = runner.invoke(app, ["compare", "kmeans", "--synthetic", "gmm", "--n", "3000", "--d", "3",
                              "--k", "3", "--epsilons", "0.05", "--trials", "3", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "kmeans: median [q1, q3] over 3 trials" in res.stdout
    lines = res.stdout.splitlines()
    for method in ("kmeans", "ckm", "ckm-quantized", "ckm-lloyd", "dplloyd", "dplloyd-su",
                   "dplloyd-su-overseed", "white", "colored"):
        assert any(line.split()[:1] == [method] and "relative_sse" in line for line in lines), method
    text = " ".join(res.stdout.split())
    assert "guarantee none (no privacy guarantee): kmeans" in text
    assert ("guarantee pure (pure ε-DP): dplloyd, dplloyd-su, dplloyd-su-overseed, ckm, "
            "ckm-quantized, ckm-lloyd") in text
    assert "guarantee local-sensitivity (local sensitivity only, not DP): white, colored" in text
    assert "not a private release" in text


def test_sample_and_aggregate_rows_carry_the_guarantee_of_each_epsilon():
    """At n = 600 (D = 72, m = 24) ε = 1 is outside Theorem 3.1 and ε = 10⁵ inside: the rows say
    none and exact-sampling, and the finite-ε 'none' is not mistaken for an ε-free reference."""
    rows = run_json("subspace", "--synthetic", "subspaces", "--n", "600", "--d", "6", "--k", "2",
                    "--q", "2", "--epsilons", "1,100000", "--trials", "1",
                    "--methods", "sample-aggregate")
    assert {(r["epsilon"], r["guarantee"]) for r in rows} == {(1.0, "none"), (1e5, "exact-sampling")}
    costs = {r["epsilon"]: r["median"] for r in rows if r["metric"] == "cost"}
    assert costs[1.0] != costs[1e5]


def test_guarantee_lines_name_a_method_whose_guarantee_depends_on_epsilon():
    from fedsketch.server.bench.compare import Row
    from fedsketch.server.cli.compare import guarantee_lines

    rows = [Row("sample-aggregate", e, m, 0.5, 0.4, 0.6, 1.0, kind) for e, kind in
            ((1.0, "none"), (300.0, "exact-sampling")) for m in ("cost", "d_W")]
    rows += [Row("gibbs", e, "cost", 0.1, 0.1, 0.1, 1.0, "asymptotic-mcmc") for e in (1.0, 300.0)]
    assert guarantee_lines(rows) == [
        "guarantee none (no privacy guarantee): sample-aggregate (ε = 1)",
        "guarantee exact-sampling ((ε, δ)-DP only if its float noise were exact): "
        "sample-aggregate (ε = 300)",
        "guarantee asymptotic-mcmc (ε-DP only for exact samples (finite MCMC chain)): gibbs"]


@pytest.mark.slow
def test_subspace_family_reports_cost_and_distance():
    rows = run_json("subspace", "--synthetic", "subspaces", "--n", "600", "--d", "6", "--k", "2",
                    "--q", "2", "--epsilons", "10", "--trials", "1",
                    "--methods", "kplane,sample-aggregate")
    assert {r["metric"] for r in rows} == {"cost", "d_W"}
    ref = next(r for r in rows if r["method"] == "kplane" and r["metric"] == "d_W")
    assert ref["median"] < 0.5  # the non-private solution finds the true subspaces
    # D = k·d² = 72, m = round(√600) = 24: ε = 10 <= 2D/√m = 29.4, outside Theorem 3.1
    assert {r["guarantee"] for r in rows if r["method"] == "sample-aggregate"} == {"none"}


@pytest.mark.parametrize(("args", "message"), [
    (["kmeans", "--synthetic", "gmm", "--epsilons", "0"], "every ε must be > 0"),
    (["kmeans", "--synthetic", "gmm", "--epsilons", "-1,1"], "every ε must be > 0"),
    (["kmeans", "--synthetic", "gmm", "--delta", "1.5"], "delta must be in (0, 1)"),
    (["kmeans", "--synthetic", "gmm", "--delta", "0"], "delta must be in (0, 1)"),
    (["kmeans", "--synthetic", "gmm", "--n", "5", "--k", "10"], "n must be ≥ k"),
    (["kmeans", "--synthetic", "gmm", "--bounds", "3:-3"], "lo < hi"),
    (["subspace", "--synthetic", "subspaces", "--d", "3", "--q", "3"], "q"),
    (["kmeans", "--synthetic", "spectrum"], "synthetic set is 'gmm'"),
    (["kmeans"], "exactly one of --data and --synthetic"),
    (["kmeans", "--synthetic", "gmm", "--methods", "kmeans,magic"], "unknown kmeans method"),
    (["clustering", "--synthetic", "gmm"], "unknown family"),
])
def test_bad_arguments_get_one_line(args, message):
    res = runner.invoke(app, ["compare", *args, "--n", "2000", "--quiet"]
                        if "--n" not in args else ["compare", *args, "--quiet"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error:") and message in res.output
    assert res.output.count("\n") == 1


def test_data_file_needs_a_box_and_strict_refuses_outliers(tmp_path):
    x = np.random.default_rng(0).normal(0, 1, (500, 2))
    x[0] = [50.0, 0.0]
    path = tmp_path / "x.npy"
    np.save(path, x)
    res = runner.invoke(app, ["compare", "kmeans", "--data", str(path), "--k", "2", "--quiet"])
    assert res.exit_code == 1 and "--bounds" in res.output
    res = runner.invoke(app, ["compare", "kmeans", "--data", str(path), "--k", "2", "--bounds",
                              "-5:5", "--methods", "dplloyd", "--trials", "1", "--quiet"])
    assert res.exit_code == 0, res.output
    assert ("note (a non-private operator diagnostic, not part of any release): 1 of 500 rows lie "
            "outside the public bound") in res.output
    for method in ("dplloyd", "ckm"):
        res = runner.invoke(app, ["compare", "kmeans", "--data", str(path), "--k", "2", "--bounds",
                                  "-5:5", "--methods", method, "--strict", "--quiet"])
        assert res.exit_code == 1 and "outside the public box" in res.output, method


def test_rows_beyond_the_norm_bound_are_counted_for_the_user():
    res = runner.invoke(app, ["compare", "pca", "--synthetic", "spectrum", "--n", "2000", "--k", "2",
                              "--norm-bound", "0.5", "--epsilons", "1", "--trials", "1",
                              "--methods", "pca", "--quiet", "--json"])
    assert res.exit_code == 0, res.output
    assert "rows lie outside the public bound" in res.output
    refused = runner.invoke(app, ["compare", "pca", "--synthetic", "spectrum", "--n", "2000", "--k",
                                  "2", "--norm-bound", "0.5", "--epsilons", "1", "--methods", "pca",
                                  "--strict", "--quiet"])
    assert refused.exit_code == 1 and "exceed the public norm bound" in refused.output


def test_as_many_clusters_as_records_is_a_clear_error(tmp_path):
    """Relative SSE divides by the reference's SSE, which is 0 when k-means fits every record."""
    path = tmp_path / "x.npy"
    np.save(path, np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]))
    res = runner.invoke(app, ["compare", "kmeans", "--data", str(path), "--k", "3", "--bounds", "-9:9",
                              "--methods", "dplloyd", "--trials", "1", "--quiet"])
    assert res.exit_code == 1, res.output
    assert "relative SSE is undefined" in res.output and "Traceback" not in res.output


def test_ckm_rows_say_when_their_centroids_are_noise():
    """3,000 records at ε = 0.01: every CKM trial decodes noise, and the row and the table say so
    (the verdict "unreliable"); at ε = 50 none does (a sketch alone is at most "usable, with
    caveats": flagged, not unreliable). Methods without the identifiability check count 0 there,
    and get their own verdict from their last noisy step."""
    args = ["compare", "kmeans", "--synthetic", "gmm", "--n", "3000", "--d", "3", "--k", "3",
            "--epsilons", "0.01,50", "--trials", "2", "--methods", "ckm,dplloyd", "--quiet"]
    rows = run_json(*args[1:])
    by = {(r["method"], r["epsilon"]): r["not_identifiable"] for r in rows}
    assert by == {("ckm", 0.01): 2, ("ckm", 50.0): 0, ("dplloyd", 0.01): 0, ("dplloyd", 50.0): 0}
    bad = {(r["method"], r["epsilon"]): r["unreliable"] for r in rows}
    assert bad[("ckm", 0.01)] == 2 and bad[("ckm", 50.0)] == 0 and bad[("dplloyd", 0.01)] == 2
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "warning: ckm at ε = 0.01: 2 of 2 trials not judged good (2 unreliable;" in text
    assert "warning: ckm at ε = 50: 2 of 2 trials not judged good (0 unreliable;" in text


def test_a_relative_sse_above_two_never_comes_without_a_warning():
    """300 records at ε = 0.05, every k-means method, two trials: each row whose two trials both
    score a relative SSE above 2 has both flagged (a verdict other than good, or a private method
    with nothing released to judge it by), and the table warns about it. Several rows are."""
    args = ["compare", "kmeans", "--synthetic", "gmm", "--n", "300", "--d", "3", "--k", "3",
            "--epsilons", "0.05", "--trials", "2", "--quiet"]
    rows = run_json(*args[1:])
    garbage = [r for r in rows if r["q1"] > 2]
    assert len(garbage) >= 3
    assert all(r["flagged"] == 2 for r in garbage), [(r["method"], r["flagged"]) for r in garbage]
    text = " ".join(runner.invoke(app, args).stdout.split())
    assert all(f"warning: {r['method']} at ε = 0.05: 2 of 2 trials not judged good" in text for r in garbage)
