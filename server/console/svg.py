"""The picture of a result: the centroids projected on a plane, drawn as SVG.

The k centroids c_1..c_k ∈ R^d (data units) with weights w_j ≥ 0 are centred on their weighted
mean c̄ = Σ w_j c_j / Σ w_j and projected on the two leading principal axes of the centred
centroids (the right singular vectors of the k × d matrix C − c̄, weighted by √w_j), so the
plane is the one that spreads the centroids most; with d = 1 the second coordinate is 0. Both
axes share one scale, so distances on the picture are distances in that plane (data units).
Each centroid is a circle of area proportional to its weight, labelled with its number and
weight; its tooltip gives its first coordinates. Every number is formatted here and all text is
escaped, so nothing of the result can become markup.
"""

from __future__ import annotations

from html import escape

import numpy as np

#: Picture size and margin (CSS pixels); radius of the heaviest and of a weightless centroid.
WIDTH, HEIGHT, MARGIN, R_MAX, R_MIN = 480, 360, 36, 22.0, 3.0
#: Coordinates shown in a centroid's tooltip.
SHOWN_COORDINATES = 8


def projection(centroids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(k, 2) coordinates of the centroids in the plane of the module docstring."""
    c = np.asarray(centroids, dtype=float).reshape(len(weights), -1)
    w = np.clip(np.asarray(weights, dtype=float), 0.0, None)
    w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / max(len(w), 1))
    centred = c - w @ c
    _, _, vt = np.linalg.svd(centred * np.sqrt(w)[:, None], full_matrices=False)
    plane = centred @ vt[:2].T
    if plane.shape[1] < 2:
        plane = np.hstack([plane, np.zeros((len(plane), 2 - plane.shape[1]))])
    return plane


def centroid_svg(centroids: np.ndarray, weights: np.ndarray) -> str:
    """The SVG element (module docstring) of ``centroids`` (k × d) with ``weights`` (k);
    ValueError if a coordinate or weight is not finite (nothing to place)."""
    w = np.asarray(weights, dtype=float)
    if not (np.isfinite(w).all() and np.isfinite(np.asarray(centroids, dtype=float)).all()):
        raise ValueError("a centroid or weight is not finite: not drawn")
    points = projection(centroids, w)
    span = float(np.max(np.ptp(points, axis=0))) if len(points) else 0.0
    scale = min(WIDTH, HEIGHT) - 2 * MARGIN
    unit = scale / span if span > 0 else 1.0
    middle = (points.max(axis=0) + points.min(axis=0)) / 2 if len(points) else np.zeros(2)
    heaviest = float(w.max()) if len(w) and w.max() > 0 else 1.0
    shapes = []
    c = np.asarray(centroids, dtype=float).reshape(len(w), -1)
    for j, ((px, py), weight) in enumerate(zip(points, w, strict=True)):
        x = WIDTH / 2 + (px - middle[0]) * unit
        y = HEIGHT / 2 - (py - middle[1]) * unit
        r = R_MIN + (R_MAX - R_MIN) * np.sqrt(max(weight, 0.0) / heaviest)
        coords = ", ".join(f"{v:.4g}" for v in c[j, :SHOWN_COORDINATES])
        more = ", …" if c.shape[1] > SHOWN_COORDINATES else ""
        tip = escape(f"centroid {j + 1}: weight {weight:.4g}, at ({coords}{more})")
        shapes.append(
            f'<g><circle class="centroid" data-index="{j + 1}" data-weight="{weight:.6g}" '
            f'cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}"><title>{tip}</title></circle>'
            f'<text x="{x + r + 3:.1f}" y="{y + 4:.1f}">{j + 1} ({weight:.3g})</text></g>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" id="centroids" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="centroids projected on their '
            f'two principal axes, area by weight"><rect width="{WIDTH}" height="{HEIGHT}" '
            f'class="frame"/>{"".join(shapes)}</svg>')
