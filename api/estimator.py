"""``CompressiveKMeans``: private compressive k-means as a scikit-learn estimator.

``fit(X)`` is ``fedsketch sketch`` then ``fedsketch decode`` on X (:func:`fedsketch.sketch`,
:func:`fedsketch.decode`): the centroids are (ε, δ)-DP with respect to X, calibration of σ
included, under the ``neighbouring`` relation. Everything else follows scikit-learn's ``KMeans``:
``predict`` (nearest centroid), ``transform`` (Euclidean distances to the centroids), ``score``
(−SSE), ``labels_`` and ``inertia_``. Those read X itself, so they are not private: they are for
the data's holder, not for publication.

Randomness: ``random_state`` seeds the public frequencies Ω, ξ and the decoder's starts. The
privacy noise comes from OS bits (the integer mechanisms of :mod:`fedsketch.common.sketch.privacy`) and
cannot be seeded, by design; nor can the masks of r < m entries per record. So a fit is
reproducible only at ε = ∞ with r = m, and the estimator's ``non_deterministic`` tag says so.

The public box ``bounds`` is where records are clipped and where the decoder looks. A private fit
(finite ε) needs it, stated without looking at the data, or ``bounds="auto"``: a private box read
from X at a stated 10 % of ε (:mod:`fedsketch.common.sketch.private_box`), counted in ε. Without
either, ``fit`` refuses (ValueError), where diffprivlib would warn and take the box from the data,
spending privacy nobody counts. At ε = ∞ (no privacy) a missing box is taken from X's range,
widened by 5 % of it on each side.

scikit-learn is imported here only, so the rest of the API works without it.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from numbers import Integral

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
    from sklearn.utils import check_random_state
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError("CompressiveKMeans needs scikit-learn: pip install scikit-learn "
                      "(or pip install 'fedsketch[bench]')") from exc

from fedsketch.common.sketch.box import Box
from fedsketch.common.sketch.private_box import BOX_FRACTION, data_box
from fedsketch.common.study.sizing import SketchSize, size_for_sketch
from fedsketch.steps import (
    Bounds,
    Decoding,
    NotIdentifiableWarning,
    as_box,
    decode,
    quality_from_dict,
    sketch,
    verdict_from_dict,
)

#: The σ search range of scale="auto", in widths of the box's widest side (``compare``'s ckm).
SCALE_RANGE = (1 / 300, 1 / 3)
#: Share of ε that scale="auto" spends on σ (``fedsketch.sketch``'s auto_fraction default).
AUTO_FRACTION = 0.1


class CompressiveKMeans(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """Differentially private k-means from one random-Fourier sketch of X (module docstring).

    Parameters
    ----------
    n_clusters : k, the number of centroids.
    epsilon : total ε of a fit, σ's calibration included (math.inf: no noise and no privacy).
    delta : δ; > 0 selects the discrete Gaussian (pure ε-DP, discrete Laplace, at 0).
    bounds : the public box: ``(lo, hi)`` (numbers, or d numbers each), ``"LO:HI"``, a
        bounds.json path, or "auto" (a private box at 10 % of ε). Required at finite ε (module
        docstring).
    m : frequencies (complex sketch entries); None: planned from the record count, d, k and the
        sketch's ε (the largest of 10, 5, 2, 1 ·k·d whose predicted signal clears the decoder's
        threshold, else 10·k·d, flagged; its work m·d·k at most 4·10⁵; ``sketch_size_`` says
        which and why; under
        add/remove the count is a noisy one at 2 % of ε, counted in ε).
    r : entries each record contributes to, 1..m; None: m.
    scale : σ in data units, or "auto": chosen privately with 10 % of ε, searched between 1/300
        and 1/3 of the box's widest side.
    feature : "complex" (e^{it}) or "quantized" (sign cos t + i·sign sin t).
    neighbouring : "replace_one" (n public) or "add_remove" (n noisy).
    replicates : CL-OMPR runs; the lowest sketch residual wins.
    random_state : int, RandomState or None; seeds Ω, ξ and the decoder, never the noise.
    scale_range : (lo, hi), σ's search range in data units for scale="auto"; None: 1/300 to 1/3
        of the box's widest side. A fit on an end of it falls back to the box's floor and warns.

    Attributes
    ----------
    cluster_centers_ : (k, d) centroids, data units. weights_ : (k,) their weights, summing to 1.
    verdict_ : the verdict on the centroids returned ("good", "usable, with caveats" or
        "unreliable", with its reason; anything but "good" also warns,
        :class:`fedsketch.NotIdentifiableWarning`). identifiability_ : as a detail, whether the
        centroids stand above the sketch's noise.
    sketch_ : the released :class:`fedsketch.Sketch` (None after :meth:`from_result`).
    sketch_size_ : the plan of m when m was not given (m, r, predicted z of a centroid, the
        decoder's threshold, whether it is expected to carry k centroids, the reason); else None.
    labels_, inertia_ : nearest centroid of each row of X and the SSE (not private).
    n_features_in_ : d. feature_names_in_ : X's column names, when it had string ones.
    """

    def __init__(self, n_clusters: int = 8, *, epsilon: float = 1.0, delta: float = 0.0,
                 bounds: Bounds | None = None, m: int | None = None, r: int | None = None,
                 scale: float | str = "auto", feature: str = "complex", neighbouring: str = "replace_one",
                 replicates: int = 3, random_state: int | np.random.RandomState | None = None,
                 scale_range: tuple[float, float] | None = None) -> None:
        self.n_clusters = n_clusters
        self.epsilon = epsilon
        self.delta = delta
        self.bounds = bounds
        self.m = m
        self.r = r
        self.scale = scale
        self.feature = feature
        self.neighbouring = neighbouring
        self.replicates = replicates
        self.random_state = random_state
        self.scale_range = scale_range

    def _n_is_private(self) -> bool:
        """Whether the record count is itself private (add/remove at a finite ε): a refusal
        that depends on it would release it, so such a fit goes on and its verdict speaks."""
        return self.neighbouring == "add_remove" and math.isfinite(float(self.epsilon))

    def fit(self, X, y=None) -> CompressiveKMeans:
        """Sketch X privately and decode ``n_clusters`` centroids (module docstring); ``y`` is
        ignored. Spends ``epsilon`` on X."""
        X = validate_data(self, X, dtype=[np.float64, np.float32])
        k, d = int(self.n_clusters), X.shape[1]
        if k < 1:
            raise ValueError(f"n_clusters must be ≥ 1, got {self.n_clusters}")
        if X.shape[0] < k and not self._n_is_private():  # scikit-learn refuses it in these words
            raise ValueError(f"n_samples={X.shape[0]} should be >= n_clusters={k}.")
        auto = isinstance(self.bounds, str) and self.bounds == "auto"
        box = None if auto else self._box(X)
        seed = self._seed()
        searched = (tuple(self.scale_range) if self.scale_range is not None else None if box is None
                    else tuple(float(np.max(box.hi - box.lo)) * f for f in SCALE_RANGE))
        epsilon, m = float(self.epsilon), self.m
        self.sketch_size_ = None
        if m is None:
            epsilon, self.sketch_size_ = self._plan(X.shape[0], d, k, auto)
            m = self.sketch_size_.m
        released = sketch(X, epsilon=epsilon, delta=self.delta, neighbouring=self.neighbouring,
                          m=m, r=self.r, feature=self.feature,
                          scale=self.scale, seed=seed, bounds="auto" if auto else box,
                          scale_range=searched)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotIdentifiableWarning)  # warned below, once
            decoding = decode(released, k, box, replicates=self.replicates, seed=seed)
        self._set_decoding(decoding, released)
        distances = self._distances(X)  # X is validated: transform would check its names again
        self.labels_ = np.argmin(distances, axis=1)
        self.inertia_ = float(np.sum(np.min(distances, axis=1) ** 2))
        return self

    def _plan(self, n: int, d: int, k: int, auto_box: bool) -> tuple[float, SketchSize]:
        """(the ε left for the sketch, the planned size) when m is not given
        (:func:`fedsketch.common.study.sizing.size_for_sketch`): m from the public count (a noisy
        one at 2 % of ε under add/remove, spent here), d, k and the ε the sketch itself gets after
        σ's and a private box's shares."""
        reads = (AUTO_FRACTION if self.scale == "auto" else 0.0) + (BOX_FRACTION if auto_box else 0.0)
        return size_for_sketch(n, d, k, float(self.epsilon), neighbouring=self.neighbouring,
                               feature=self.feature, reads=reads)

    def predict(self, X) -> np.ndarray:
        """The index of each row's nearest centroid (int64 (n,))."""
        return np.argmin(self.transform(X), axis=1)

    def transform(self, X) -> np.ndarray:
        """Euclidean distances (n, k) from each row to each centroid, data units."""
        check_is_fitted(self)
        return self._distances(validate_data(self, X, dtype=[np.float64, np.float32], reset=False))

    def _distances(self, X: np.ndarray) -> np.ndarray:
        """:meth:`transform` of an X already validated."""
        c = self.cluster_centers_
        x = np.asarray(X, dtype=np.float64)
        d2 = (x * x).sum(axis=1)[:, None] - 2.0 * x @ c.T + (c * c).sum(axis=1)[None, :]
        return np.sqrt(np.maximum(d2, 0.0))

    def score(self, X, y=None) -> float:
        """−SSE of X against the centroids (higher is better, as ``KMeans.score``); not private."""
        return -float(np.sum(np.min(self.transform(X), axis=1) ** 2))

    @classmethod
    def from_result(cls, result: Decoding | dict | str | os.PathLike, **params) -> CompressiveKMeans:
        """A fitted estimator from a decoding made elsewhere: a :class:`fedsketch.Decoding`, its
        JSON form as a dict (``fedsketch decode --json``, or ``fedsketch coordinator result`` for a
        federated study), or the path of such a JSON file. ``params`` are the constructor's
        (n_clusters is the result's k); labels_ and inertia_ stay unset, no data having been seen."""
        if isinstance(result, (str, os.PathLike)):
            with open(result, encoding="utf-8") as fh:
                result = json.load(fh)
        if isinstance(result, dict):
            try:
                result = Decoding(np.asarray(result["centroids"], dtype=np.float64),
                                  np.asarray(result["weights"], dtype=np.float64),
                                  float(result.get("residual", math.nan)),
                                  verdict_from_dict(result["identifiability"]),
                                  quality_from_dict(result))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError("not a decoding result (it needs centroids, weights, identifiability): "
                                 f"{exc!r}") from None
        c = result.centroids
        if (c.ndim != 2 or c.shape[0] == 0 or not np.all(np.isfinite(c))
                or result.weights.shape != c.shape[:1]):
            raise ValueError(f"a result needs finite centroids (k, d) and k weights, got {c.shape} "
                             f"and {result.weights.shape}")
        model = cls(n_clusters=c.shape[0], **params)
        model.n_features_in_ = c.shape[1]
        model.sketch_size_ = None
        model._set_decoding(result, None)
        return model

    def _set_decoding(self, decoding: Decoding, released) -> None:
        """The fitted attributes of a decoding; warns unless its verdict is "good"."""
        self.cluster_centers_ = np.array(decoding.centroids, dtype=np.float64)
        self.weights_ = np.array(decoding.weights, dtype=np.float64)
        self.identifiability_ = decoding.identifiability
        self.verdict_ = decoding.verdict
        self.sketch_ = released
        if decoding.verdict.warns:
            warnings.warn(f"{decoding.verdict.status}: {decoding.verdict.reason}", NotIdentifiableWarning,
                          stacklevel=3)

    def _box(self, X: np.ndarray) -> Box:
        """The public box (module docstring): ``bounds``, or X's widened range at ε = ∞."""
        if self.bounds is not None:
            return as_box(self.bounds, X.shape[1])
        if math.isfinite(float(self.epsilon)):
            raise ValueError("a private fit (finite epsilon) needs bounds=(lo, hi), the public box of "
                             "the data, stated without looking at it; deriving it from X would spend "
                             "privacy that epsilon does not count")
        return data_box(lambda: iter((X,)), X.shape[1])

    def _seed(self) -> int:
        """The public seed of Ω, ξ and the decoder from ``random_state`` (an int is used as is)."""
        if isinstance(self.random_state, Integral):
            return int(self.random_state)
        return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))

    @property
    def _n_features_out(self) -> int:
        """k: ``transform``'s columns (named ``compressivekmeans0``, ... by get_feature_names_out)."""
        return self.cluster_centers_.shape[0]

    def __sklearn_tags__(self):
        """scikit-learn's tags: non-deterministic unless ε = ∞ and r = m (module docstring)."""
        tags = super().__sklearn_tags__()
        r_is_m = self.r is None or (self.m is not None and self.r == self.m)
        tags.non_deterministic = not (_is_inf(self.epsilon) and r_is_m)
        return tags


def _is_inf(epsilon: object) -> bool:
    """Whether ``epsilon`` is ∞ (False for anything that is not a number: fit refuses it)."""
    try:
        return math.isinf(float(epsilon))
    except (TypeError, ValueError):
        return False
