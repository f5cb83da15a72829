"""Secure aggregation of integer vectors mod 2^B with distributed discrete-Laplace noise.

Protocol: Bonawitz et al., CCS 2017, semi-honest variant, over an optional sparse public
neighbour graph (SecAgg+, Bell et al., CCS 2020). Transport-independent: plain message
dataclasses and pure functions; the coordinator routes every message.

Notation. Devices u have public Shamir coordinates x(u) = 1 + rank of u among the sorted ids and
an enrolled Ed25519 key. N(u) is u's neighbour set in the public graph (:func:`neighbours`; all
other devices when ``degree`` is None), N⁺(u) = N(u) ∪ {u}. t is the Shamir threshold, applied
within each N⁺(u). A ⊇ K ⊇ Y are the devices whose advert, shares and masked input reached the
coordinator.

1. Advertise. u draws two X25519 key pairs, (c_sk, c_pk) for encrypting shares and (s_sk, s_pk)
   for masking, and sends Advert(u, c_pk, s_pk, Ed25519 signature over (study, u, c_pk, s_pk)).
2. Share keys. u receives the adverts of A ∩ N(u), verifies every signature against the enrolled
   key, and aborts unless its holder set H(u) = {u} ∪ (A ∩ N(u)) has at least t members. It
   draws a 32-byte self-mask seed b_u and Shamir-shares s_sk_u and b_u t-of-|H(u)|; v's pair of
   shares goes out encrypted under AES-256-GCM with key HKDF(X25519(c_sk_u, c_pk_v), study, u→v)
   and associated data (study, u, v); u keeps its own pair.
3. Masked input. u receives the ciphertexts of K ∩ N(u), aborts on any that fails to decrypt and
   unless |K ∩ N⁺(u)| ≥ t, and sends, with s_uv = HKDF(X25519(s_sk_u, s_pk_v), study, {u, v}),

       y_u = x_u + e_u + PRG(b_u) + Σ_{v ∈ K∩N(u)} σ(u, v) · PRG(s_uv)   (mod 2^B),

   σ(u, v) = +1 if u < v else −1, so the pairwise masks of two devices in Y cancel in Σ y.
   PRG(k) is the AES-256-CTR keystream of key k (zero IV), read as little-endian uint64 words
   reduced mod 2^B (uniform, as 2^B divides 2^64); e_u is u's noise share.
4. Unmask. Each u ∈ Y is asked, for its neighbours, for the b-share of each survivor in
   Y ∩ N⁺(u) and the s_sk-share of each dropped device in (K \\ Y) ∩ N(u). It aborts if a peer is
   on both lists, if it ever revealed the other kind of share for that peer, if it is itself
   listed as dropped, or if fewer than t survivors are listed. The coordinator interpolates b_v
   for v ∈ Y and s_sk_d for d ∈ K \\ Y (at least t shares each), and outputs

       Σ_{v∈Y} y_v − Σ_{v∈Y} PRG(b_v) − Σ_{d∈K\\Y} Σ_{v∈Y∩N(d)} σ(v, d) · PRG(s_vd)
         = Σ_{v∈Y} (x_v + e_v)   (mod 2^B),

   centred into [−2^{B−1}, 2^{B−1}). A device dropped after sending y_v keeps its noise share in.

Security scope: semi-honest. Against a coordinator that follows the protocol (plus fewer than t
colluding devices per neighbourhood) only the sum is revealed; the malicious-server consistency
round of Bonawitz et al. (signed survivor lists) is not implemented, so a coordinator that lies
to different devices about who dropped is out of scope.

Distributed noise (MECHANISMS §4): e_u = NB(1/h_min, 1−a) − NB(1/h_min, 1−a) per coordinate with
a = exp(−ε/Δ1). Σ over m' ≥ h_min submitters is NB(m'/h_min) − NB(m'/h_min), i.e. DLap(a) plus
independent extra noise (variance × m'/h_min); the modulus is sized so the total decodes exactly.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, wraps
from typing import NoReturn, TypeVar

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from . import signing
from .dp.calibration import noise_radius
from .shamir import SHARE_BYTES, combine, decode_share, encode_share, split

MAX_BITS = 62  # the masked payload travels as uint64
KEY_BYTES = 32
NONCE_BYTES = 12
KIND_B = "b"  # share of a survivor's self-mask seed
KIND_SK = "s_sk"  # share of a dropped device's masking private key
_DOMAIN = b"fedsketch/secagg/v1/"


class SecAggAbort(Exception):
    """The protocol cannot continue safely; ``reason`` says why. Nothing further is revealed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _fail(reason: str) -> NoReturn:
    raise SecAggAbort(reason)


_Method = TypeVar("_Method", bound=Callable)


def _final(method: _Method) -> _Method:
    """Make a SecAggAbort raised by a stage final: the party refuses every later stage."""

    @wraps(method)
    def stage(self, *args, **kwargs):
        if self._aborted is not None:
            raise SecAggAbort(f"already aborted: {self._aborted}")
        try:
            return method(self, *args, **kwargs)
        except SecAggAbort as exc:
            self._aborted = exc.reason
            raise

    return stage  # type: ignore[return-value]


# ---------------------------------------------------------------- modulus


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


# ---------------------------------------------------------------- public parameters and graph


def neighbours(device_ids: Sequence[str], degree: int | None, seed: bytes) -> dict[str, list[str]]:
    """The public undirected neighbour graph: id → sorted neighbour ids (never itself).

    ``degree`` None (or ≥ n−1) gives the complete graph. Otherwise a Harary graph on a public
    random ring: devices are ordered by SHA-256(domain ‖ seed ‖ id), each is joined to the
    ⌊degree/2⌋ nearest on either side and, for odd degree, to the one(s) opposite (±⌊n/2⌋).
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
    order = sorted(ids, key=lambda u: hashlib.sha256(
        _DOMAIN + b"graph" + signing.field(seed) + signing.field(u)).digest())
    offsets = [k for h in range(1, degree // 2 + 1) for k in (h, -h)]
    if degree % 2:
        offsets += [n // 2, -(n // 2)]
    return {u: sorted({order[(i + k) % n] for k in offsets}) for i, u in enumerate(order)}


def default_threshold(holders: int) -> int:
    """⌊holders/2⌋ + 1: a strict majority of a neighbourhood N⁺(u)."""
    return holders // 2 + 1


@dataclass(frozen=True)
class SecAggParams:
    """The public parameters of one secure-aggregation round.

    ``device_ids`` (stored sorted) are the invited devices; ``threshold`` t applies within every
    N⁺(u) and must not exceed the smallest one; ``bits`` B (1..62, see :func:`check_capacity`)
    and ``dim`` fix the payload; ``degree``/``graph_seed`` fix the graph (:func:`neighbours`).
    """

    study_id: str
    device_ids: tuple[str, ...]
    threshold: int
    bits: int
    dim: int
    degree: int | None = None
    graph_seed: bytes = b""

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_ids", tuple(sorted(self.device_ids)))
        if not self.device_ids:
            raise ValueError("a round needs at least one device")
        if not 1 <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must lie in 1..{MAX_BITS}, got {self.bits}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        smallest = min(len(v) + 1 for v in self.graph.values())
        if not 1 <= self.threshold <= smallest:
            raise ValueError(f"threshold must lie in 1..{smallest} (smallest neighbourhood), "
                             f"got {self.threshold}")

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


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class Advert:
    """Stage 1 message: u's X25519 public keys (raw 32 bytes each) and its Ed25519 signature."""

    device_id: str
    c_pk: bytes
    s_pk: bytes
    signature: bytes


@dataclass(frozen=True)
class UnmaskRequest:
    """Stage 4 request to one device: whose b-share (survivors) and s_sk-share (dropped) to send."""

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


# ---------------------------------------------------------------- primitives (all `cryptography`)


def advert_digest(study_id: str, device_id: str, c_pk: bytes, s_pk: bytes) -> bytes:
    """SHA-256(domain ‖ L(study) ‖ L(device) ‖ L(c_pk) ‖ L(s_pk)): what an advert's signature covers."""
    h = hashlib.sha256(_DOMAIN + b"advert")
    for part in (study_id, device_id, c_pk, s_pk):
        h.update(signing.field(part))
    return h.digest()


def verify_advert(advert: Advert, study_id: str, public_key: bytes) -> bool:
    """True iff the advert's signature verifies under the device's enrolled Ed25519 key."""
    digest = advert_digest(study_id, advert.device_id, advert.c_pk, advert.s_pk)
    return signing.verify(public_key, digest, advert.signature)


def _public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _agree(key: X25519PrivateKey, peer_public: bytes) -> bytes:
    """X25519(key, peer); SecAggAbort on a malformed or low-order peer key."""
    try:
        return key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:
        raise SecAggAbort(f"key agreement failed: {exc}") from exc


def _hkdf(secret: bytes, label: bytes, *fields: str) -> bytes:
    info = _DOMAIN + label + b"".join(signing.field(f) for f in fields)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def _share_context(study_id: str, sender: str, receiver: str) -> bytes:
    return _DOMAIN + b"shares" + signing.field(study_id) + signing.field(sender) + signing.field(receiver)


def _seal(shared: bytes, study_id: str, sender: str, receiver: str, plaintext: bytes) -> bytes:
    """nonce ‖ AES-256-GCM(key = HKDF(shared, study, sender→receiver), ad = (study, sender, receiver))."""
    key = _hkdf(shared, b"share-key", study_id, sender, receiver)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, _share_context(study_id, sender, receiver))


def _open(shared: bytes, study_id: str, sender: str, receiver: str, ciphertext: bytes) -> bytes:
    key = _hkdf(shared, b"share-key", study_id, sender, receiver)
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:],
                                   _share_context(study_id, sender, receiver))
    except (InvalidTag, ValueError) as exc:
        raise SecAggAbort(f"the shares from {sender} do not decrypt") from exc


def _mask_seed(shared: bytes, study_id: str, u: str, v: str) -> bytes:
    """s_uv = HKDF(X25519 secret, study, min(u,v), max(u,v)): the same on both sides."""
    return _hkdf(shared, b"mask", study_id, *sorted((u, v)))


def prg(seed: bytes, dim: int, bits: int) -> np.ndarray:
    """``dim`` words uniform mod 2^bits: the AES-256-CTR keystream of ``seed`` (zero IV), as uint64 LE.

    Each seed keys exactly one stream, so the fixed IV never repeats under one key.
    """
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * dim)), dtype="<u8").astype(np.uint64)
    return words & np.uint64(2**bits - 1)


def _add_pair_mask(acc: np.ndarray, mask: np.ndarray, u: str, v: str) -> None:
    """acc += σ(u, v) · mask (mod 2^64), σ(u, v) = +1 if u < v else −1."""
    if u < v:
        acc += mask
    else:
        acc -= mask


def _as_words(values: np.ndarray, dim: int, name: str) -> np.ndarray:
    """An integer (dim,) vector as uint64 words (two's complement, i.e. its value mod 2^64)."""
    arr = np.asarray(values)
    if arr.shape != (dim,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an integer vector of shape ({dim},), got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64).view(np.uint64)


# ---------------------------------------------------------------- the device


class Client:
    """One device's secure-aggregation state for one study (module docstring, stages 1–4).

    ``signing_key`` is the device's raw Ed25519 private key; ``enrolled`` maps device ids to
    their raw Ed25519 public keys as registered at enrollment. Any SecAggAbort is final: every
    later call raises it again.
    """

    def __init__(self, params: SecAggParams, device_id: str, signing_key: bytes,
                 enrolled: Mapping[str, bytes]) -> None:
        if device_id not in params.share_x:
            raise ValueError(f"{device_id!r} is not invited to study {params.study_id!r}")
        self.params = params
        self.device_id = device_id
        self._signing_key = signing_key
        self._enrolled = dict(enrolled)
        self._c_sk = X25519PrivateKey.generate()
        self._s_sk = X25519PrivateKey.generate()
        self._b = secrets.token_bytes(KEY_BYTES)
        self._advert: Advert | None = None
        self._peers: dict[str, Advert] | None = None  # verified adverts of A ∩ N(u)
        self._channels: dict[str, bytes] = {}  # peer → X25519(c_sk_u, c_pk_v), for both directions
        self._held: dict[str, tuple[int, int]] = {}  # peer → (s_sk-share, b-share) at x(u)
        self._masked = False
        self._revealed: dict[str, str] = {}  # peer → kind of share already revealed
        self._aborted: str | None = None

    @_final
    def advertise(self) -> Advert:
        """Stage 1: the signed advert of (c_pk, s_pk); the same advert if asked again."""
        if self._advert is None:
            c_pk, s_pk = _public(self._c_sk), _public(self._s_sk)
            digest = advert_digest(self.params.study_id, self.device_id, c_pk, s_pk)
            self._advert = Advert(self.device_id, c_pk, s_pk, signing.sign(self._signing_key, digest))
        return self._advert

    def _verified(self, adverts: Mapping[str, Advert]) -> dict[str, Advert]:
        peers = {}
        for v, advert in adverts.items():
            if advert.device_id != v:
                _fail(f"advert filed under {v!r} is from {advert.device_id!r}")
            if v == self.device_id:
                if advert != self._advert:
                    _fail("my own advert came back altered")
                continue
            if v not in self.params.graph[self.device_id]:
                _fail(f"advert from {v!r}, who is not my neighbour")
            key = self._enrolled.get(v)
            if key is None or not verify_advert(advert, self.params.study_id, key):
                _fail(f"the advert of {v!r} is not signed by its enrolled key")
            peers[v] = advert
        return peers

    @_final
    def share_keys(self, adverts: Mapping[str, Advert]) -> dict[str, bytes]:
        """Stage 2: verify the neighbours' adverts, share s_sk and b t-of-|H(u)|; receiver → ciphertext.

        H(u) = {u} ∪ {advertised neighbours}; aborts if |H(u)| < t or any advert is bad.
        """
        if self._advert is None or self._peers is not None:
            _fail("share_keys must follow advertise and run once")
        peers = self._verified(adverts)
        t, x = self.params.threshold, self.params.share_x
        holders = [self.device_id, *peers]
        if len(holders) < t:
            _fail(f"only {len(holders)} holders (me and advertised neighbours) for threshold {t}")
        xs = [x[v] for v in holders]
        s_shares = split(self._s_sk.private_bytes_raw(), t, xs)
        b_shares = split(self._b, t, xs)
        self._channels = {v: _agree(self._c_sk, advert.c_pk) for v, advert in peers.items()}
        self._peers = peers
        self._held[self.device_id] = (s_shares[x[self.device_id]], b_shares[x[self.device_id]])
        return {
            v: _seal(self._channels[v], self.params.study_id, self.device_id, v,
                     encode_share(x[v], s_shares[x[v]]) + encode_share(x[v], b_shares[x[v]]))
            for v in peers
        }

    def _receive(self, sender: str, ciphertext: bytes) -> tuple[int, int]:
        if self._peers is None or sender not in self._peers:
            _fail(f"shares from {sender!r}, who did not advertise to me")
        plain = _open(self._channels[sender], self.params.study_id, sender, self.device_id, ciphertext)
        try:
            (xs, s_share), (xb, b_share) = (decode_share(plain[:SHARE_BYTES]),
                                            decode_share(plain[SHARE_BYTES:]))
        except ValueError as exc:
            _fail(f"the shares from {sender!r} are malformed: {exc}")
        if xs != xb or xs != self.params.share_x[self.device_id]:
            _fail(f"the shares from {sender!r} are not at my coordinate")
        return s_share, b_share

    @_final
    def masked_input(self, x: np.ndarray, ciphertexts: Mapping[str, bytes],
                     noise_share: np.ndarray | None = None) -> np.ndarray:
        """Stage 3: store the neighbours' shares and return y_u (uint64, values < 2^B); once only.

        y_u = x + noise_share + PRG(b_u) + Σ_{v sent shares} σ(u, v) PRG(s_uv) mod 2^B. Aborts on
        a ciphertext that does not decrypt or if fewer than t of N⁺(u) (u included) shared keys.
        """
        if self._peers is None or self._masked:
            _fail("masked_input must follow share_keys and run once (one masked input per study)")
        dim, bits, t = self.params.dim, self.params.bits, self.params.threshold
        y = _as_words(x, dim, "x")  # a fresh copy
        if noise_share is not None:
            y += _as_words(noise_share, dim, "noise_share")
        received = {v: self._receive(v, ct) for v, ct in ciphertexts.items()}
        if len(received) + 1 < t:
            _fail(f"only {len(received) + 1} of my neighbourhood shared keys; threshold {t}")
        self._held.update(received)
        self._masked = True
        y += prg(self._b, dim, bits)
        for v in received:
            shared = _agree(self._s_sk, self._peers[v].s_pk)
            seed = _mask_seed(shared, self.params.study_id, self.device_id, v)
            _add_pair_mask(y, prg(seed, dim, bits), self.device_id, v)
        return y & np.uint64(2**bits - 1)

    @_final
    def unmask(self, survivors: Collection[str], dropped: Collection[str]) -> dict[str, tuple[str, bytes]]:
        """Stage 4: peer → (``KIND_B``, b-share) for survivors, (``KIND_SK``, s_sk-share) for dropped.

        Aborts, revealing nothing, if a peer is in both lists or was earlier asked for the other
        kind, if a listed peer's shares are not held, if u itself is listed as dropped (it sent
        its masked input), or if fewer than t survivors are listed.
        """
        if not self._masked:
            _fail("unmask must follow masked_input")
        alive, gone = set(survivors), set(dropped)
        t = self.params.threshold
        if alive & gone:
            _fail(f"asked for both shares of {sorted(alive & gone)}")
        if self.device_id in gone:
            _fail("listed as dropped although I sent my masked input")
        if (alive | gone) - self._held.keys():
            _fail(f"asked for shares I do not hold: {sorted((alive | gone) - self._held.keys())}")
        conflict = [v for v in alive if self._revealed.get(v, KIND_B) != KIND_B]
        conflict += [v for v in gone if self._revealed.get(v, KIND_SK) != KIND_SK]
        if conflict:
            _fail(f"the other kind of share was already revealed for {sorted(conflict)}")
        if len(alive) < t:
            _fail(f"only {len(alive)} survivors listed; threshold {t}")
        me = self.params.share_x[self.device_id]
        out = {v: (KIND_B, encode_share(me, self._held[v][1])) for v in alive}
        out |= {v: (KIND_SK, encode_share(me, self._held[v][0])) for v in gone}
        self._revealed |= {v: kind for v, (kind, _) in out.items()}
        return out


# ---------------------------------------------------------------- the coordinator


class Aggregator:
    """The coordinator's side: routes the stages and outputs only Σ_{v∈Y} (x_v + e_v).

    Call ``collect_adverts``, ``collect_shares``, ``collect_masked``, ``collect_unmask`` in order,
    each with the messages that arrived (a missing device has dropped). Invalid messages count as
    missing and are listed in ``rejected`` (device → reason). Below the threshold any stage
    raises SecAggAbort and every later call raises it again; nothing is released.
    """

    _STAGES = ("adverts", "shares", "masked", "unmask", "done")

    def __init__(self, params: SecAggParams, enrolled: Mapping[str, bytes]) -> None:
        self.params = params
        self.rejected: dict[str, str] = {}
        self._enrolled = dict(enrolled)
        self._stage = 0
        self._aborted: str | None = None
        self._adverts: dict[str, Advert] = {}  # A
        self._keyed: frozenset[str] = frozenset()  # K
        self._requests: dict[str, UnmaskRequest] = {}  # one per device of Y
        self._total: np.ndarray | None = None  # Σ_{v∈Y} y_v mod 2^B

    def _enter(self, stage: str) -> None:
        if self._STAGES[self._stage] != stage:
            raise RuntimeError(f"stage {stage!r} called while expecting {self._STAGES[self._stage]!r}")
        self._stage += 1

    def _require(self, count: int, what: str) -> None:
        if count < self.params.threshold:
            _fail(f"only {count} devices {what}; threshold {self.params.threshold}")

    def _keep(self, messages: Mapping, problem: Callable[[str, object], str | None]) -> dict:
        """The messages whose ``problem(u, message)`` is None; the others go to ``rejected``."""
        kept = {}
        for u, message in messages.items():
            reason = problem(u, message)
            if reason is None:
                kept[u] = message
            else:
                self.rejected[u] = reason
        return kept

    def _advert_problem(self, u: str, advert: Advert) -> str | None:
        if u not in self.params.share_x or advert.device_id != u:
            return "advert from an uninvited device or filed under another id"
        key = self._enrolled.get(u)
        if key is None or not verify_advert(advert, self.params.study_id, key):
            return "advert not signed by the enrolled key"
        return None

    @_final
    def collect_adverts(self, adverts: Mapping[str, Advert]) -> dict[str, dict[str, Advert]]:
        """Stage 1 → 2: A = valid adverts; each u ∈ A gets the adverts of A ∩ N(u)."""
        self._enter("adverts")
        self._adverts = self._keep(adverts, self._advert_problem)
        self._require(len(self._adverts), "advertised")
        graph = self.params.graph
        return {u: {v: self._adverts[v] for v in graph[u] if v in self._adverts} for u in self._adverts}

    @_final
    def collect_shares(self, shares: Mapping[str, Mapping[str, bytes]]) -> dict[str, dict[str, bytes]]:
        """Stage 2 → 3: K = devices that sent a ciphertext to each of A ∩ N(u); route to K ∩ N(u)."""
        self._enter("shares")
        graph = self.params.graph

        def problem(u: str, outbox: Mapping[str, bytes]) -> str | None:
            if u not in self._adverts:
                return "shares from a device that did not advertise"
            if set(outbox) != graph[u] & self._adverts.keys():
                return "shares not addressed to exactly the advertised neighbours"
            return None

        kept = self._keep(shares, problem)
        self._require(len(kept), "shared keys")
        self._keyed = frozenset(kept)
        return {u: {v: kept[v][u] for v in graph[u] if v in kept} for u in kept}

    @_final
    def collect_masked(self, masked: Mapping[str, np.ndarray]) -> dict[str, UnmaskRequest]:
        """Stage 3 → 4: Y = valid masked inputs; keep only Σ y mod 2^B; ask each u ∈ Y to unmask."""
        self._enter("masked")
        p = self.params

        def problem(u: str, y: np.ndarray) -> str | None:
            if u not in self._keyed:
                return "masked input from a device that did not share keys"
            y = np.asarray(y)
            if y.shape != (p.dim,) or y.dtype != np.uint64 or (y >> np.uint64(p.bits)).any():
                return f"masked input is not {p.dim} uint64 values below 2^{p.bits}"
            return None

        kept = self._keep(masked, problem)
        self._require(len(kept), "sent a masked input")
        total = np.zeros(p.dim, dtype=np.uint64)
        for y in kept.values():
            total += np.asarray(y)
        self._total = total
        gone = self._keyed - kept.keys()
        self._requests = {
            u: UnmaskRequest(tuple(sorted(p.closed(u) & kept.keys())), tuple(sorted(p.graph[u] & gone)))
            for u in kept
        }
        return dict(self._requests)

    def _response_problem(self, u: str, response: Mapping[str, tuple[str, bytes]]) -> str | None:
        request = self._requests.get(u)
        if request is None:
            return "unmask response from a device that was not asked"
        expected = {v: KIND_B for v in request.survivors} | {v: KIND_SK for v in request.dropped}
        if {v: kind for v, (kind, _) in response.items()} != expected:
            return "unmask response does not answer the request"
        try:
            if any(decode_share(share)[0] != self.params.share_x[u] for _, share in response.values()):
                return "unmask share not at the responder's coordinate"
        except ValueError as exc:
            return f"malformed unmask share: {exc}"
        return None

    def _reconstruct(self, shares: dict[int, int], whose: str, kind: str) -> bytes:
        """The 32-byte secret from the first t shares (by coordinate); SecAggAbort below t."""
        t = self.params.threshold
        if len(shares) < t:
            _fail(f"only {len(shares)} shares of {kind} of {whose!r}; threshold {t}")
        try:
            return combine(dict(sorted(shares.items())[:t]), KEY_BYTES, t=t)
        except ValueError as exc:
            _fail(f"cannot reconstruct {kind} of {whose!r}: {exc}")

    @_final
    def collect_unmask(self, responses: Mapping[str, Mapping[str, tuple[str, bytes]]]) -> np.ndarray:
        """Stage 4 → result: interpolate b_v (v ∈ Y) and s_sk_d (d ∈ K \\ Y), strip every mask.

        Returns Σ_{v∈Y} (x_v + e_v) as int64, centred: values ≥ 2^{B−1} are negative.
        """
        self._enter("unmask")
        p = self.params
        kept = self._keep(responses, self._response_problem)
        collected: dict[tuple[str, str], dict[int, int]] = {}
        for response in kept.values():
            for v, (kind, share) in response.items():
                x, y = decode_share(share)
                collected.setdefault((kind, v), {})[x] = y
        survivors = frozenset(self._requests)
        total = self._total.copy()
        for v in survivors:
            total -= prg(self._reconstruct(collected.get((KIND_B, v), {}), v, KIND_B), p.dim, p.bits)
        for d in sorted(self._keyed - survivors):
            linked = p.graph[d] & survivors
            if linked:
                total -= self._unlink(d, collected.get((KIND_SK, d), {}), linked)
        total &= np.uint64(2**p.bits - 1)
        signed = total.astype(np.int64)
        signed[total >= np.uint64(2 ** (p.bits - 1))] -= np.int64(2**p.bits)
        return signed

    def _unlink(self, d: str, shares: dict[int, int], linked: Collection[str]) -> np.ndarray:
        """Σ_{v ∈ linked} σ(v, d) PRG(s_vd): the masks survivors added for dropped d, from s_sk_d."""
        key = X25519PrivateKey.from_private_bytes(self._reconstruct(shares, d, KIND_SK))
        if _public(key) != self._adverts[d].s_pk:
            _fail(f"the reconstructed s_sk of {d!r} does not match its advert")
        out = np.zeros(self.params.dim, dtype=np.uint64)
        for v in linked:
            seed = _mask_seed(_agree(key, self._adverts[v].s_pk), self.params.study_id, d, v)
            _add_pair_mask(out, prg(seed, self.params.dim, self.params.bits), v, d)
        return out
