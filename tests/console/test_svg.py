"""The centroids' picture (:mod:`fedsketch.server.console.svg`): one circle per centroid, areas in
proportion to the weights, the projection on the centroids' principal plane keeping distances
when d = 2 (a rotation: distances in the picture are the data's, times one scale), d = 1 drawn on
a line, and every text escaped; the SVG parses as XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from fedsketch.server.console.svg import R_MAX, R_MIN, centroid_svg, projection

SVG = "{http://www.w3.org/2000/svg}"


def circles(svg: str) -> list[dict]:
    root = ET.fromstring(svg)
    return [c.attrib for c in root.iter(f"{SVG}circle")]


def test_two_dimensional_centroids_keep_their_distances():
    rng = np.random.default_rng(0)
    c, w = rng.normal(size=(5, 2)) * 7, rng.uniform(0.1, 1.0, 5)
    drawn = circles(centroid_svg(c, w))
    assert len(drawn) == 5
    xy = np.array([[float(d["cx"]), float(d["cy"])] for d in drawn])
    data = np.linalg.norm(c[:, None] - c[None], axis=2)
    picture = np.linalg.norm(xy[:, None] - xy[None], axis=2)
    scale = picture[data > 0] / data[data > 0]
    assert scale == pytest.approx(np.full(scale.shape, scale[0]), rel=2e-2)  # one scale (0.1 px rounding)
    assert [float(d["data-weight"]) for d in drawn] == pytest.approx(w, rel=1e-5)
    r = np.array([float(d["r"]) for d in drawn])
    heaviest = np.argmax(w)
    assert r[heaviest] == pytest.approx(R_MAX, abs=0.05)
    assert (r - R_MIN) ** 2 / (R_MAX - R_MIN) ** 2 == pytest.approx(w / w.max(), abs=1e-2)


def test_the_plane_spreads_the_centroids_most():
    """Centroids on a line in R^5 are drawn on a line; the weighted mean is at the origin."""
    direction = np.array([1.0, -2.0, 0.5, 3.0, 0.0])
    t, w = np.array([-2.0, 0.0, 1.0, 4.0]), np.array([1.0, 2.0, 3.0, 4.0])
    c = np.outer(t, direction) + 10.0
    p = projection(c, w)
    assert np.abs(p[:, 1]).max() < 1e-9
    assert np.abs(p[:, 0]) == pytest.approx(np.abs(t - w @ t / w.sum()) * np.linalg.norm(direction))
    assert w @ p == pytest.approx(np.zeros(2), abs=1e-9)


def test_one_dimension_one_centroid_and_zero_weights_draw():
    assert len(circles(centroid_svg(np.array([[1.0], [3.0], [-2.0]]), np.array([0.2, 0.3, 0.5])))) == 3
    assert len(circles(centroid_svg(np.array([[1.0, 2.0]]), np.array([1.0])))) == 1
    assert len(circles(centroid_svg(np.zeros((2, 3)), np.zeros(2)))) == 2


def test_the_tooltips_hold_numbers_and_a_non_finite_centroid_is_refused():
    svg = centroid_svg(np.array([[1.0, 2.0], [0.0, 1.0]]), np.array([0.5, 0.5]))
    titles = [t.text for t in ET.fromstring(svg).iter(f"{SVG}title")]
    assert titles == ["centroid 1: weight 0.5, at (1, 2)", "centroid 2: weight 0.5, at (0, 1)"]
    with pytest.raises(ValueError, match="finite"):
        centroid_svg(np.array([[1.0, np.inf], [0.0, 1.0]]), np.array([0.5, 0.5]))
