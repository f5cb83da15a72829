"""``fedsketch.CompressiveKMeans``: accuracy against scikit-learn's KMeans on a mixture, the
public-box rule, from_result on a real federated round, and scikit-learn's estimator checks."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import parametrize_with_checks

from fedsketch import CompressiveKMeans, NotIdentifiableWarning, decode, sketch
from fedsketch.common.data.synthetic import gmm
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import run_simulation

#: Relative SSE (SSE of the fit / SSE of KMeans, n_init = 3) on MIXTURE with bounds ±20, measured
#: over 40 runs each (random_state 0..39 at ε = ∞; 40 fits at ε = 1, whose noise is from OS bits):
#: ε = ∞ median 1.040, max 1.116 (1.060 at random_state 0, the test's); ε = 1 (random_state 0)
#: mean 1.059, sd 0.010, max 1.079. The limit sits above every measured run, 6 sd above ε = 1's mean.
LIMIT = 1.12
MIXTURE = dict(n=100_000, k=5, d=4, separation=2.5, seed=7)


@pytest.fixture(scope="module")
def mixture() -> tuple[np.ndarray, float]:
    x, _, _ = gmm(**MIXTURE)
    return x, KMeans(5, n_init=3, random_state=0).fit(x).inertia_


@pytest.mark.blas
@pytest.mark.parametrize("epsilon", [math.inf, 1.0])
def test_fit_matches_kmeans_on_a_mixture(mixture, epsilon):
    x, reference = mixture
    model = CompressiveKMeans(5, epsilon=epsilon, bounds=(-20, 20), random_state=0)
    with pytest.warns(NotIdentifiableWarning, match="^usable, with caveats: "):
        labels = model.fit_predict(x)  # a sketch alone is never "good" (common/study/verdict.py)
    assert model.inertia_ / reference < LIMIT
    assert model.identifiability_.status == "identified"
    assert model.verdict_.status == "usable, with caveats"
    assert model.cluster_centers_.shape == (5, 4) and model.n_features_in_ == 4
    assert model.sketch_.epsilon_spent == epsilon and model.sketch_.n == x.shape[0]
    assert np.array_equal(labels, model.labels_) and np.array_equal(model.predict(x), labels)
    distances = model.transform(x[:100])
    assert distances.shape == (100, 5) and np.array_equal(distances.argmin(axis=1), labels[:100])
    assert model.score(x) == pytest.approx(-model.inertia_, rel=1e-9)


@pytest.mark.filterwarnings("ignore::UserWarning")  # 5,000 records at ε = 1: noisy, as it should be
def test_only_a_noiseless_fit_with_every_entry_repeats_itself():
    """random_state fixes Ω, ξ and the decoder; the noise (and r < m's masks) come from OS bits,
    and the non_deterministic tag says when."""
    x, _, _ = gmm(5_000, 3, 2, 3.0, 1)

    def centres(**params) -> np.ndarray:
        return CompressiveKMeans(3, bounds=(-12, 12), random_state=0, **params).fit(x).cluster_centers_

    assert np.array_equal(centres(epsilon=math.inf), centres(epsilon=math.inf))
    assert not np.array_equal(centres(epsilon=1.0), centres(epsilon=1.0))
    assert not get_tags(CompressiveKMeans(epsilon=math.inf)).non_deterministic
    assert get_tags(CompressiveKMeans(epsilon=1.0)).non_deterministic
    assert get_tags(CompressiveKMeans(epsilon=math.inf, r=1)).non_deterministic


def test_a_private_fit_needs_a_public_box():
    x = np.random.default_rng(0).normal(size=(500, 2))
    with pytest.raises(ValueError, match="needs bounds"):
        CompressiveKMeans(2, epsilon=1.0).fit(x)
    model = CompressiveKMeans(2, epsilon=math.inf, random_state=0).fit(x)  # no privacy: X's range
    assert np.all(model.cluster_centers_ >= x.min(axis=0) - 0.05 * np.ptp(x, axis=0) - 1e-9)
    assert np.all(model.cluster_centers_ <= x.max(axis=0) + 0.05 * np.ptp(x, axis=0) + 1e-9)


def test_more_clusters_than_records_is_refused_as_scikit_learn_refuses_it():
    from sklearn.cluster import KMeans

    x = np.random.default_rng(0).normal(size=(4, 2))
    with pytest.raises(ValueError) as theirs:
        KMeans(5, n_init=1).fit(x)
    model = CompressiveKMeans(5, epsilon=1.0, bounds=(-5, 5))
    with pytest.raises(ValueError) as ours:
        model.fit(x)
    assert str(ours.value) == str(theirs.value) == "n_samples=4 should be >= n_clusters=5."
    assert not hasattr(model, "sketch_")  # refused before anything was spent
    CompressiveKMeans(4, epsilon=math.inf, bounds=(-5, 5), random_state=0).fit(x)  # k = n fits


def test_under_add_remove_the_record_count_is_private_and_decides_nothing():
    """Under add/remove n is private (the release carries it noised): refusing n < k would
    tell n < k from n ≥ k with certainty, so the fit goes on; replace-one (n public) refuses."""
    x = np.random.default_rng(0).normal(size=(4, 2))
    with pytest.raises(ValueError, match="n_samples=4 should be >= n_clusters=5"):
        CompressiveKMeans(5, epsilon=1.0, bounds=(-5, 5), neighbouring="replace_one").fit(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotIdentifiableWarning)
        model = CompressiveKMeans(5, epsilon=1.0, bounds=(-5, 5), neighbouring="add_remove", m=40,
                                  random_state=0).fit(x)
    assert model.cluster_centers_.shape == (5, 2)


def test_the_scale_range_is_an_option():
    x = np.random.default_rng(0).normal(size=(3000, 2))
    model = CompressiveKMeans(2, epsilon=math.inf, bounds=(-5, 5), scale_range=(0.2, 0.3),
                              random_state=0).fit(x)
    cal = model.sketch_.calibration
    assert (cal["sigma_lo"], cal["sigma_hi"]) == (0.2, 0.3)
    assert cal["choice"] == "failed: range edge"  # a unit blob's scale lies above 0.3


def test_a_dataframe_fit_warns_nothing_about_feature_names():
    """fit on a DataFrame records its column names, and fit, predict and fit_predict on that
    same DataFrame must not tell the user it lacks them (scikit-learn's feature-name check)."""
    pd = pytest.importorskip("pandas")
    x, _, _ = gmm(5_000, 3, 2, 3.0, 1)
    frame = pd.DataFrame(x, columns=["a", "b"])
    model = CompressiveKMeans(3, epsilon=math.inf, bounds=(-12, 12), random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", NotIdentifiableWarning)  # the verdict's caveat, not names
        labels = model.fit_predict(frame)
        assert np.array_equal(model.predict(frame), labels)
    assert list(model.feature_names_in_) == ["a", "b"]
    assert model.inertia_ == pytest.approx(-model.score(frame), rel=1e-9)


def test_from_result_of_a_decoding_and_of_a_federated_round(tmp_path):
    x, _, centres = gmm(20_000, 3, 2, 3.0, 5)
    decoding = decode(sketch(x, epsilon=math.inf, m=60, seed=1, bounds=(-12, 12)), 3, (-12, 12), seed=0)
    for given in (decoding, decoding.to_dict()):
        model = CompressiveKMeans.from_result(given, epsilon=math.inf)
        assert np.array_equal(model.cluster_centers_, decoding.centroids)
        assert np.array_equal(model.weights_, decoding.weights) and model.n_clusters == 3
        assert model.identifiability_ == decoding.identifiability
        assert model.get_params()["epsilon"] == math.inf
        assert np.array_equal(model.predict(x), np.argmin(model.transform(x), axis=1))
    # a study's result from a real coordinator and devices over gRPC (what `coordinator result`
    # and `simulate --json` print: no noise_sd, plus devices, records, ...)
    report = run_simulation(SimConfig(devices=3, records=30_000, k=3, d=3, m=60, epsilon=20.0, r=60,
                                      scale=1.5, bound=12.0, replicates=1))
    path = tmp_path / "result.json"
    path.write_text(json.dumps(report))
    model = CompressiveKMeans.from_result(path)
    assert np.array_equal(model.cluster_centers_, np.array(report["centroids"]))
    assert model.identifiability_.status == report["identifiability"]["status"]
    assert model.n_features_in_ == 3 and model.predict(np.zeros((4, 3))).shape == (4,)
    with pytest.raises(ValueError, match="not a decoding result"):
        CompressiveKMeans.from_result({"centroids": [[0.0, 1.0]]})


#: Checks that fail for a private fit, and why (docs/python-api.md's table). At ε = ∞ and r = m every check
#: applies and passes. At finite ε the non_deterministic tag leaves out the checks that need a
#: seeded fit to repeat itself: check_methods_sample_order_invariance and
#: check_methods_subset_invariance are not generated; check_transformer_general,
#: check_transformer_data_not_an_array and check_pipeline_consistency skip.
PRIVATE_FAILURES = {
    "check_fit_idempotent": "two fits with one random_state differ: the privacy noise is drawn from "
                            "OS bits and cannot be seeded (check_fit_idempotent ignores the "
                            "non_deterministic tag)",
    "check_clustering": "50 records at ε = 1 carry far more noise than signal (the decoding is "
                        "'not identifiable'), so the adjusted Rand index 0.4 asked for is not reached",
}


def _expected_failures(estimator: CompressiveKMeans) -> dict[str, str]:
    return {} if math.isinf(estimator.epsilon) else PRIVATE_FAILURES


@parametrize_with_checks([CompressiveKMeans(epsilon=math.inf, replicates=1),
                          CompressiveKMeans(epsilon=1.0, bounds=(-30, 30), replicates=1)],
                         expected_failed_checks=_expected_failures)
def test_scikit_learn_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotIdentifiableWarning)
        warnings.simplefilter("ignore", UserWarning)
        check(estimator)


@pytest.mark.filterwarnings("ignore:the calibration sketch is noisy")
def test_clustering_check_fails_at_finite_epsilon_for_the_stated_reason():
    """PRIVATE_FAILURES' check_clustering reason, checked: the check's 50 standardized blobs at
    ε = 1 decode as not identifiable."""
    from sklearn.datasets import make_blobs
    from sklearn.preprocessing import StandardScaler

    x, _ = make_blobs(n_samples=50, random_state=1)
    x = StandardScaler().fit_transform(x)
    with pytest.warns(NotIdentifiableWarning):
        model = CompressiveKMeans(3, epsilon=1.0, bounds=(-30, 30), replicates=1, random_state=0).fit(x)
    assert model.identifiability_.status == "not identifiable"


def test_a_private_fit_reads_its_own_box_with_bounds_auto():
    """bounds="auto": a private fit with no box stated (kelvin and miles, columns 100× apart)
    spends 10 % of ε on a private box, counts it in the sketch's ε, and finds the clusters."""
    rng = np.random.default_rng(8)
    centres = np.array([[300.0, 500.0], [330.0, 2500.0], [270.0, 4000.0]])
    x = np.concatenate([c + rng.normal(0, [5.0, 150.0], (10_000, 2)) for c in centres])
    model = CompressiveKMeans(3, epsilon=2.0, bounds="auto", m=300, random_state=0).fit(x)
    assert model.sketch_.box is not None and model.sketch_.box["epsilon"] == pytest.approx(0.2)
    assert model.sketch_.epsilon_spent == pytest.approx(2.0)
    got = model.cluster_centers_[np.argsort(model.cluster_centers_[:, 1])]
    assert np.all(np.abs(got - centres) < [10, 300]), got
