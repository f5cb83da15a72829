"""The public parameters of a secure-aggregation round: the neighbour graph, the Shamir
threshold and the modulus 2^B (MECHANISMS §4.4)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ..dp.calibration import noise_radius
from ..net import signing
from .protocol import DOMAIN_PREFIX
from .trust import neighbourhood_size, split_reach

MAX_BITS = 62  # the masked payload travels as uint64


def modulus_bits(n_max: int, a: float, dim: int, shape: float = 1.0) -> int:
    """Smallest B with 2^{B−1} > n_max + t, t = :func:`noise_radius` (MECHANISMS §4.4).

    ``n_max`` is the public bound on |integer sum| per coordinate; the centred sum mod 2^B then
    decodes exactly except with probability 2^−40 per study.
    """
    if n_max < 0:
        raise ValueError(f"n_max must be >= 0, got {n_max}")
    return (n_max + noise_radius(a, dim, shape)).bit_length() + 1


def check_capacity(n_max: int, a: float, dim: int, shape: float = 1.0) -> int:
    """:func:`modulus_bits`, refused (ValueError with the reason) beyond ``MAX_BITS`` = 62."""
    bits = modulus_bits(n_max, a, dim, shape)
    if bits > MAX_BITS:
        t = noise_radius(a, dim, shape)
        raise ValueError(
            f"secure aggregation needs a {bits}-bit modulus (sum bound {n_max} + noise radius {t}) "
            f"but the masked payload travels as uint64 with at most {MAX_BITS} bits"
        )
    return bits


def ring_order(device_ids: Sequence[str], seed: bytes) -> list[str]:
    """The devices on the public random ring: sorted by SHA-256(domain ‖ "graph" ‖ L(seed) ‖
    L(id)). The sparse graph joins neighbours on it; the signing committee is its first
    devices."""
    return sorted(device_ids, key=lambda u: hashlib.sha256(
        DOMAIN_PREFIX + b"graph" + signing.field(seed) + signing.field(u)).digest())


def neighbours(device_ids: Sequence[str], degree: int | None, seed: bytes) -> dict[str, list[str]]:
    """The public undirected neighbour graph: id → sorted neighbour ids (never itself).

    ``degree`` None (or ≥ n−1) gives the complete graph. Otherwise a Harary graph on the public
    random ring of :func:`ring_order`: each device is joined to the ⌊degree/2⌋ nearest on
    either side and, for odd degree, to the one(s) opposite (±⌊n/2⌋).
    Every device then has exactly ``degree`` neighbours (degree+1 when degree and n are odd).
    Every party computes the same graph from the same seed.
    """
    ids = sorted(device_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("device ids must be distinct")
    n = len(ids)
    if degree is None or degree >= n - 1:
        return {u: [v for v in ids if v != u] for u in ids}
    if degree < 1:
        raise ValueError(f"degree must be >= 1 or None, got {degree}")
    order = ring_order(ids, seed)
    offsets = [k for h in range(1, degree // 2 + 1) for k in (h, -h)]
    if degree % 2:
        offsets += [n // 2, -(n // 2)]
    return {u: sorted({order[(i + k) % n] for k in offsets}) for i, u in enumerate(order)}


def graph_seed(study_id: str) -> bytes:
    """The public seed of a study's neighbour graph: SHA-256 of a domain tag and the study id."""
    return hashlib.sha256(b"fedsketch/secagg-graph/" + study_id.encode()).digest()


@dataclass(frozen=True)
class SecAggParams:
    """The public parameters of one secure-aggregation round.

    ``device_ids`` (stored sorted) are the invited devices; ``threshold`` t applies within every
    N⁺(u): it must not exceed the smallest one, and must exceed (|N⁺(u)| + min(C, |N(u)|))/2 in
    every one, C = ``colluders`` (rule 2 of :mod:`.trust`: otherwise a coordinator could unmask
    one device from disjoint halves of its neighbours); ``bits`` B (1..62, see
    :func:`check_capacity`) and ``dim`` fix the payload; ``degree``/``graph_seed`` fix the graph
    (:func:`neighbours`); ``min_submitters`` (L − D of :mod:`.trust`) is the fewest masked
    inputs the round may be unmasked with, and must exceed half of the roster plus the
    colluders (rule 4 of :mod:`.trust`, so the consistency round can finish); None takes the
    fewest that rule allows, ⌊(n + C)/2⌋ + 1.

    The consistency round (stage 4) counts the signatures of a public **signing committee**:
    the first p = min(n, 2D' + C + 1) devices of :func:`ring_order`, D' = n − min_submitters
    the dropouts the round may still see. A device unmasks against q = ⌊(p + C)/2⌋ + 1
    committee signatures on its list. Uniqueness: an honest member signs one list and at most
    C members collude, so two lists would need 2q ≤ p + C signatures. Liveness: even if all D'
    dropouts are members, p − D' ≥ q remain. So each device verifies q = D' + C + 1 signatures
    (⌊(n + C)/2⌋ + 1 at most), not one per survivor.
    """

    study_id: str
    device_ids: tuple[str, ...]
    threshold: int
    bits: int
    dim: int
    degree: int | None = None
    graph_seed: bytes = b""
    colluders: int = 0
    min_submitters: int | None = None

    def __post_init__(self) -> None:
        for name in ("threshold", "bits", "dim", "degree", "colluders", "min_submitters"):
            value = getattr(self, name)
            if type(value) is not int and not (name in ("degree", "min_submitters") and value is None):
                raise ValueError(f"round parameter {name!r} must be an integer, got {value!r}")
        object.__setattr__(self, "device_ids", tuple(sorted(self.device_ids)))
        n = len(self.device_ids)
        if n == 0 or len(set(self.device_ids)) != n:
            raise ValueError("a round needs at least one device, and distinct device ids")
        if self.degree is not None and self.degree < 1:
            raise ValueError(f"degree must be >= 1 or None, got {self.degree}")
        least = (n + self.colluders) // 2 + 1  # the fewest with 2D' + C < n
        if self.min_submitters is None:
            object.__setattr__(self, "min_submitters", least)
        if not 1 <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must lie in 1..{MAX_BITS}, got {self.bits}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.colluders < 0:
            raise ValueError(f"colluders must be >= 0, got {self.colluders}")
        if not least <= self.min_submitters <= n:
            raise ValueError(
                f"min_submitters must lie in {least}..{n}, got {self.min_submitters}: with "
                f"D' = n − min_submitters dropouts still possible and C = {self.colluders} "
                f"colluders, the consistency round needs 2D' + C < n = {n} to make the survivor "
                f"list unique and still finish")
        size = neighbourhood_size(n, self.degree)  # |N(u)|, the same for every u
        if not 1 <= self.threshold <= size + 1:
            raise ValueError(f"threshold must lie in 1..{size + 1} (smallest neighbourhood), "
                             f"got {self.threshold}")
        exposed = split_reach(size, self.colluders)
        if 2 * self.threshold <= exposed:
            raise ValueError(
                f"threshold {self.threshold} is too low: with {self.colluders} colluders, a "
                f"neighbourhood's shares could unmask one device from disjoint halves "
                f"(2t must exceed {exposed})")

    @property
    def committee_size(self) -> int:
        """p = min(n, 2D' + C + 1), D' = n − min_submitters (class docstring)."""
        left = len(self.device_ids) - self.min_submitters
        return min(len(self.device_ids), 2 * left + self.colluders + 1)

    @property
    def consistency_quorum(self) -> int:
        """q = ⌊(p + C)/2⌋ + 1: the committee's signatures on one survivor list that a device
        needs before it unmasks (class docstring; rule 4 of :mod:`.trust`)."""
        return (self.committee_size + self.colluders) // 2 + 1

    @cached_property
    def committee(self) -> frozenset[str]:
        """The signing committee: the first p devices of :func:`ring_order`."""
        return frozenset(ring_order(self.device_ids, self.graph_seed)[:self.committee_size])

    @cached_property
    def graph(self) -> dict[str, frozenset[str]]:
        """N(u) for every device u."""
        return {u: frozenset(v) for u, v in neighbours(self.device_ids, self.degree, self.graph_seed).items()}

    @cached_property
    def share_x(self) -> dict[str, int]:
        """x(u) = 1 + rank of u: the public Shamir coordinate of each device."""
        return {u: i + 1 for i, u in enumerate(self.device_ids)}

    def closed(self, u: str) -> frozenset[str]:
        """N⁺(u) = N(u) ∪ {u}."""
        return self.graph[u] | {u}
