"""Secure aggregation of integer vectors mod 2^B with distributed discrete-Laplace noise.

Protocol: Bonawitz et al., CCS 2017, with its consistency round, over an optional sparse public
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
4. Consistency. Every u ∈ Y receives the survivor list Y and signs (study, Y) with its
   enrolled key, once: it refuses a second, different list, and any Y that leaves it out,
   holds devices outside the roster, is shorter than L − D (``min_submitters``), names a
   neighbour whose shares u does not hold, or has fewer than t members in N⁺(u).
5. Unmask. Each signer receives Y with signatures collected on it and checks that Y is the
   list it signed and that at least q of them are valid signatures of surviving members of
   the public signing committee: the first p = min(n, 2D' + C + 1) devices of the public
   ring, q = ⌊(p + C)/2⌋ + 1, n the roster, D' = n − (L − D) the dropouts the round may
   still see, C the stated colluders (:class:`SecAggParams`). From that list alone it
   reveals, for its neighbours,
   the b-share of each survivor in Y ∩ N⁺(u) and the s_sk-share of each device that shared
   keys with it and is not in Y. The coordinator interpolates b_v for v ∈ Y and s_sk_d for
   d ∈ K \\ Y (at least t shares each), and outputs

       Σ_{v∈Y} y_v − Σ_{v∈Y} PRG(b_v) − Σ_{d∈K\\Y} Σ_{v∈Y∩N(d)} σ(v, d) · PRG(s_vd)
         = Σ_{v∈Y} (x_v + e_v)   (mod 2^B),

   centred into [−2^{B−1}, 2^{B−1}). A device dropped after sending y_v keeps its noise share in.

Security. Against a coordinator that deviates from the protocol, the consistency round makes
the survivor list unique: an honest committee member signs one list, so two lists with q
member signatures each would need 2q ≤ p + C. Even if every dropout still possible is a
member, p − D' ≥ q members remain, so the round can finish; a device verifies q signatures
(D' + C + 1 once the committee is smaller than the roster). Every honest device then
reveals, for every peer, the kind of
share that one list implies, and the coordinator learns nothing but Σ_{v∈Y} (x_v + e_v) over
at least L − D inputs (the masked input of a device it leaves out of Y stays hidden behind
b_v, whose shares are never revealed). This needs L > 2D + C (rule 4 of :mod:`.trust`), a
graph that keeps the honest survivors connected (rule 5), and enrolled keys that are the
devices' own: the roster and its keys are the coordinator's word (Bonawitz et al. assume a
public-key infrastructure), and a coordinator that gives one device a key map of its own
making can play all the others to it. The threshold rule of :mod:`.trust`
(2t > |N⁺(u)| + colluders among N(u)) stays as a second defence: no split of one
neighbourhood into the two kinds of share reaches t twice. Devices that collude beyond the
stated C void both.

Distributed noise (MECHANISMS §4): e_u = NB(1/h_min, 1−a) − NB(1/h_min, 1−a) per coordinate with
a = exp(−ε/Δ1). Σ over m' ≥ h_min submitters is NB(m'/h_min) − NB(m'/h_min), i.e. DLap(a) plus
independent extra noise (variance × m'/h_min); the modulus is sized so the total decodes exactly.

Modules: :mod:`.protocol` (stages, messages, aborts), :mod:`.params` (public parameters, graph,
modulus), :mod:`.trust` (the stated dropouts and colluders, h_min and the safe thresholds),
:mod:`.crypto` (key agreement, HKDF, sealing, PRG), :mod:`.client` (the device),
:mod:`.aggregator` (the coordinator), :mod:`.wire` (message bodies for the gRPC service),
:mod:`.abort` (the abort statements and certificate of a failed round: rule B of
docs/secure-aggregation.md). The
noise shares are drawn by :func:`fedsketch.common.dp.samplers.dlap_noise_share`.
"""

from .aggregator import Aggregator
from .client import Client
from .crypto import KEY_BYTES, NONCE_BYTES, advert_digest, prg, survivors_digest, verify_advert
from .params import MAX_BITS, SecAggParams, check_capacity, graph_seed, modulus_bits, neighbours
from .protocol import KIND_B, KIND_SK, Advert, SecAggAbort, SignedSurvivors, Stage

__all__ = [
    "KEY_BYTES", "KIND_B", "KIND_SK", "MAX_BITS", "NONCE_BYTES", "Advert", "Aggregator", "Client",
    "SecAggAbort", "SecAggParams", "SignedSurvivors", "Stage", "advert_digest", "check_capacity",
    "graph_seed", "modulus_bits", "neighbours", "prg", "survivors_digest", "verify_advert",
]
