"""Exact 1-D samplers and Gibbs samplers for the vector and matrix Bingham distributions.

Vector Bingham on the unit sphere S^{d−1}: density ∝ exp(xᵀAx) w.r.t. the uniform measure, A
symmetric (d × d). Matrix Bingham on the Stiefel manifold {V ∈ R^{d×k}: VᵀV = I_k}: density
∝ exp(tr(B VᵀAV)) w.r.t. the Haar measure, B = diag(b_1..b_k). Both are sampled by Hoff's Gibbs
scheme (MECHANISMS §8.4): the vector sampler updates one coordinate of y = Eᵀx (A = E diag(l) Eᵀ)
at a time, drawing θ = y_i² from the exact 1-D conditional of §8.5; the matrix sampler updates one
column at a time as a vector Bingham draw in the orthogonal complement of the other columns, and,
when d = k (that complement is a line), rotates pairs of columns in their plane by an exactly
sampled angle. Every draw comes from the caller's ``rng``; a privacy mechanism must pass a
generator from :func:`fedsketch.common.dp.samplers.noise_rng`. The chains are exact Gibbs kernels, so
their output is distributed as the target only in the limit of many sweeps (MECHANISMS §10.18).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from fedsketch.common.data.synthetic import random_orthonormal

#: Below this a < 0 the truncated Gamma(½, 1/|a|) proposal is used (its truncation keeps ≥ 84%).
GAMMA_BRANCH_BELOW = -1.0


def sample_theta(a: float, p: int, rng: np.random.Generator) -> float:
    """One exact draw θ ∈ (0, 1) from f(θ) ∝ θ^{−1/2}(1−θ)^κ e^{aθ}, κ = (p−3)/2, p ≥ 2.

    This is the law of y_i² for one coordinate of a vector Bingham draw on S^{p−1} given the
    direction of the other coordinates (κ = k_H − 1 with Hoff's k_H = (p−1)/2). Branches, all exact
    rejection samplers:

    * p = 2, a < 0: f is symmetric under θ → 1−θ up to a ↦ −a, so return 1 − (draw with −a);
    * a < −1 (p ≥ 3): θ ~ Gamma(½, scale 1/|a|) redrawn until θ < 1, accepted w.p. (1−θ)^κ ≤ 1;
    * −1 ≤ a ≤ 0: θ ~ Beta(½, k_H), accepted w.p. e^{aθ} ≥ e^{−1};
    * a > 0: Hoff's envelope Beta(½, g), g = max(1/(1+ln(2+a)), k_H − a), accepted w.p.
      exp(aθ + (k_H−g)ln(1−θ) − M), M = a − (k_H−g) + (k_H−g)ln((k_H−g)/a) its maximum;
    * guard (§8.5, §10.17): when g ≥ k_H (p = 2 and a < e − 2) that maximum does not exist
      (ln of a non-positive number); then θ ~ Beta(½, k_H) accepted w.p. e^{a(θ−1)} ≥ e^{−a}.
    """
    if p < 2 or not math.isfinite(a):
        raise ValueError(f"the 1-D conditional needs p >= 2 and a finite a, got p = {p}, a = {a}")
    if p == 2 and a < 0:
        return 1.0 - sample_theta(-a, 2, rng)
    k_h = (p - 1) / 2
    if a > 0:
        g = max(1.0 / (1.0 + math.log(2.0 + a)), k_h - a)
        return _theta_beta(a, k_h, rng) if g >= k_h else _theta_hoff(a, k_h, g, rng)
    if a < GAMMA_BRANCH_BELOW:
        return _theta_gamma(a, (p - 3) / 2, rng)
    return _theta_beta(a, k_h, rng)


def _log_uniform(rng: np.random.Generator) -> float:
    """ln U for U ~ Uniform(0, 1), drawn as −Exp(1) (never ln 0)."""
    return -float(rng.standard_exponential())


def _theta_beta(a: float, k_h: float, rng: np.random.Generator) -> float:
    """Beta(½, k_H) proposal, accepted w.p. exp(aθ − max(a, 0)) ≤ 1 (any a; used for |a| small)."""
    top = max(a, 0.0)
    while True:
        theta = float(rng.beta(0.5, k_h))
        if _log_uniform(rng) <= a * theta - top:
            return theta


def _theta_gamma(a: float, kappa: float, rng: np.random.Generator) -> float:
    """a < 0, κ ≥ 0: Gamma(½, 1/|a|) truncated to (0, 1), accepted w.p. (1−θ)^κ."""
    while True:
        theta = float(rng.gamma(0.5, -1.0 / a))
        if theta < 1.0 and _log_uniform(rng) <= kappa * math.log1p(-theta):
            return theta


def _theta_hoff(a: float, k_h: float, g: float, rng: np.random.Generator) -> float:
    """a > 0, g < k_H: Beta(½, g) proposal under the envelope (1−θ)^{k_H−g}e^{aθ} ≤ e^M."""
    c = k_h - g
    top = a - c + c * math.log(c / a)
    while True:
        theta = float(rng.beta(0.5, g))
        if theta < 1.0 and _log_uniform(rng) <= a * theta + c * math.log1p(-theta) - top:
            return theta


def sample_rotation_angle(c: float, rng: np.random.Generator) -> float:
    """One exact draw φ ∈ [0, 2π) from f(φ) ∝ exp(c·cos²φ).

    cos²φ = (1 + cos 2φ)/2, so ψ = 2φ mod 2π is von Mises with mean 0 (c ≥ 0) or π (c < 0) and
    concentration |c|/2; φ is ψ/2 or ψ/2 + π with probability ½ each.
    """
    psi = float(rng.vonmises(0.0 if c >= 0 else math.pi, abs(c) / 2.0)) % (2.0 * math.pi)
    return psi / 2.0 + math.pi * float(rng.integers(0, 2))


def _random_sign(rng: np.random.Generator) -> float:
    """±1 with probability 1/2 each."""
    return 1.0 if rng.random() < 0.5 else -1.0


def _uniform_direction(p: int, rng: np.random.Generator) -> np.ndarray:
    """A point (p,) uniform on the unit sphere S^{p−1} (a normalized standard Gaussian)."""
    g = rng.standard_normal(p)
    return g / np.linalg.norm(g)


def _bingham_scan(lam: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One Gibbs scan over the coordinates of y (unit, eigenbasis of A; eigenvalues ``lam``);
    on S^0 = {±1} (p = 1) the scan draws the sign.

    For coordinate i with u = y_{−i}/‖y_{−i}‖ held fixed: θ = y_i² has density
    ∝ θ^{−1/2}(1−θ)^{(p−3)/2} e^{aθ}, a = l_i − Σ_{j≠i} l_j u_j²; then y_{−i} ← √(1−θ)·u and
    y_i ← ±√θ. If y_{−i} = 0 the direction u is undefined (a null event) and is drawn uniformly.
    """
    p = y.size
    if p == 1:
        return np.array([_random_sign(rng)])
    for i in rng.permutation(p):
        rest = y.copy()
        rest[i] = 0.0
        r2 = float(rest @ rest)
        if r2 == 0.0:
            rest[np.arange(p) != i] = _uniform_direction(p - 1, rng)
            r2 = 1.0
        a = float(lam[i] - (lam @ (rest * rest)) / r2)
        theta = sample_theta(a, p, rng)
        y = rest * math.sqrt((1.0 - theta) / r2)
        y[i] = _random_sign(rng) * math.sqrt(theta)
        y /= np.linalg.norm(y)
    return y


def _vector_chain(lam: np.ndarray, e: np.ndarray, x: np.ndarray, n_iter: int,
                  rng: np.random.Generator) -> np.ndarray:
    """``n_iter`` scans from the unit vector x for exp(xᵀ E diag(lam) Eᵀ x); returns E y."""
    y = e.T @ x
    for _ in range(n_iter):
        y = _bingham_scan(lam, y, rng)
    return e @ y


def _check_symmetric(a: np.ndarray) -> np.ndarray:
    """A as a finite float64 square matrix, symmetrized (A + Aᵀ)/2 after checking that it is
    symmetric to 1e-10 relative to max|A_ij|; ValueError otherwise."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or not np.all(np.isfinite(a)):
        raise ValueError(f"A must be a finite square matrix, got shape {a.shape}")
    if np.abs(a - a.T).max() > 1e-10 * max(1.0, float(np.abs(a).max())):
        raise ValueError("A must be symmetric")
    return (a + a.T) / 2.0


def _check_n_iter(n_iter: int) -> None:
    """Refuse a negative number of Gibbs scans."""
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")


def sample_vector_bingham(A: np.ndarray, rng: np.random.Generator, n_iter: int = 100,
                          x0: np.ndarray | None = None) -> np.ndarray:
    """A unit vector x ∈ R^d after ``n_iter`` Gibbs scans for the density ∝ exp(xᵀAx) on S^{d−1}.

    ``x0`` is the start (normalized; uniform on the sphere from ``rng`` when None). One scan updates
    each of the d eigen-coordinates once, in a random order (see :func:`_bingham_scan`).
    """
    a = _check_symmetric(A)
    _check_n_iter(n_iter)
    d = a.shape[0]
    if x0 is None:
        x = _uniform_direction(d, rng)
    else:
        x = np.asarray(x0, dtype=np.float64).reshape(-1)
        if x.size != d or not np.linalg.norm(x) > 0:
            raise ValueError(f"x0 must be a non-zero vector of length {d}")
        x = x / np.linalg.norm(x)
    lam, e = np.linalg.eigh(a)
    return _vector_chain(lam, e, x, n_iter, rng)


def _complement(w: np.ndarray) -> np.ndarray:
    """Orthonormal basis (d × (d−j)) of the orthogonal complement of the j orthonormal columns w."""
    d, j = w.shape
    if j == 0:
        return np.eye(d)
    q, _ = np.linalg.qr(w, mode="complete")
    return q[:, j:]


def _column_sweep(a: np.ndarray, b: np.ndarray, v: np.ndarray, rng: np.random.Generator) -> None:
    """d > k (or d = k = 1): each column, in random order, gets one vector-Bingham scan in the
    complement N_r of the other columns, for exp(b_r·zᵀ(N_rᵀAN_r)z), z = N_rᵀv_r; updates ``v``
    in place."""
    k = v.shape[1]
    for r in rng.permutation(k):
        n_r = _complement(np.delete(v, r, axis=1))
        lam, e = np.linalg.eigh(b[r] * (n_r.T @ a @ n_r))
        z = n_r.T @ v[:, r]
        v[:, r] = n_r @ _vector_chain(lam, e, z / np.linalg.norm(z), 1, rng)


def _pair_sweep(a: np.ndarray, b: np.ndarray, v: np.ndarray, rng: np.random.Generator) -> None:
    """d = k: every pair (r, s) of columns, in random order, is redrawn in its own plane.

    With P = [v_r v_s] and PᵀAP = E diag(m_1, m_2) Eᵀ, the conditional frame is
    (v_r, v_s) = P E [(cos φ, sin φ), ±(−sin φ, cos φ)], of density ∝ exp(c·cos²φ),
    c = (b_r − b_s)(m_1 − m_2), with the sign uniform; updates ``v`` in place.
    """
    k = v.shape[1]
    pairs = list(itertools.combinations(range(k), 2))
    for idx in rng.permutation(len(pairs)):
        r, s = pairs[idx]
        plane = v[:, [r, s]]
        m, e = np.linalg.eigh(plane.T @ a @ plane)
        phi = sample_rotation_angle(float((b[r] - b[s]) * (m[0] - m[1])), rng)
        cos, sin = math.cos(phi), math.sin(phi)
        frame = plane @ e
        v[:, r] = frame @ np.array([cos, sin])
        v[:, s] = _random_sign(rng) * (frame @ np.array([-sin, cos]))


def _diagonal(B: np.ndarray) -> np.ndarray:
    """The k diagonal entries of B, given as a length-k vector or a diagonal (k, k) matrix."""
    b = np.asarray(B, dtype=np.float64)
    if b.ndim == 2 and b.shape[0] == b.shape[1] and np.all(b[~np.eye(b.shape[0], dtype=bool)] == 0):
        b = np.diag(b).copy()
    if b.ndim != 1 or not np.all(np.isfinite(b)):
        raise ValueError(f"B must be a finite length-k vector or a diagonal (k, k) matrix, got {b.shape}")
    return b


def _check_start(v0: np.ndarray, d: int, k: int) -> np.ndarray:
    """V0 as a float64 copy after checking its shape (d, k) and orthonormal columns (VᵀV = I_k
    to 1e-8); ValueError otherwise."""
    v = np.array(v0, dtype=np.float64)
    if v.shape != (d, k):
        raise ValueError(f"V0 must have shape ({d}, {k}), got {v.shape}")
    if not np.abs(v.T @ v - np.eye(k)).max() <= 1e-8:
        raise ValueError("V0 must have orthonormal columns")
    return v


def sample_matrix_bingham(A: np.ndarray, B: np.ndarray, rng: np.random.Generator, n_iter: int = 100,
                          V0: np.ndarray | None = None) -> np.ndarray:
    """V ∈ R^{d×k} with orthonormal columns after ``n_iter`` Gibbs sweeps for the density
    ∝ exp(tr(B VᵀAV)) = exp(Σ_r b_r v_rᵀAv_r) on the Stiefel manifold (Haar base measure).

    ``A`` symmetric (d × d); ``B`` the diagonal (b_1..b_k) as a length-k vector or a diagonal (k, k)
    matrix; ``V0`` an orthonormal (d, k) start (Haar from ``rng`` when None). One sweep updates every
    column once (d > k, MECHANISMS §8.4; d = k = 1 draws the sign) or every pair of columns once
    (d = k ≥ 2).
    """
    a = _check_symmetric(A)
    _check_n_iter(n_iter)
    d = a.shape[0]
    b = _diagonal(B)
    k = b.size
    if not 1 <= k <= d:
        raise ValueError(f"need 1 <= k <= d, got k = {k}, d = {d}")
    v = random_orthonormal(d, k, rng) if V0 is None else _check_start(V0, d, k)
    sweep = _pair_sweep if d == k > 1 else _column_sweep
    for _ in range(n_iter):
        sweep(a, b, v, rng)
    return v
