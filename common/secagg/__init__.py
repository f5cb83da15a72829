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

Security scope: semi-honest. Against a coordinator that deviates there is one defence: the
threshold rule of :mod:`.trust` (2t > |N⁺(u)| + colluders among N(u)) stops it from unmasking
one device by asking part of its neighbourhood for one kind of share and the rest for the
other. The consistency round of Bonawitz et al. (devices sign the survivor list and reveal
shares only against t signatures on the same list) is not implemented, and without it a
coordinator that sends different survivor lists to different devices, each list long enough
to pass every device's checks, can still (i) learn the sum of fewer than h_min honest devices,
in any graph, and (ii) in a sparse graph, unmask one device, by rebuilding its neighbours' mask
keys from their own neighbourhoods. The checks that a device sees at least L − D survivors (in
the complete graph) and that the coordinator unmasks only L − D or more inputs hold against a
coordinator that follows the protocol, not against one that deviates this way.

Distributed noise (MECHANISMS §4): e_u = NB(1/h_min, 1−a) − NB(1/h_min, 1−a) per coordinate with
a = exp(−ε/Δ1). Σ over m' ≥ h_min submitters is NB(m'/h_min) − NB(m'/h_min), i.e. DLap(a) plus
independent extra noise (variance × m'/h_min); the modulus is sized so the total decodes exactly.

Modules: :mod:`.protocol` (stages, messages, aborts), :mod:`.params` (public parameters, graph,
modulus), :mod:`.trust` (the stated dropouts and colluders, h_min and the safe thresholds),
:mod:`.crypto` (key agreement, HKDF, sealing, PRG), :mod:`.client` (the device),
:mod:`.aggregator` (the coordinator), :mod:`.wire` (message bodies for the gRPC service). The
noise shares are drawn by :func:`fedsketch.common.dp.samplers.dlap_noise_share`.
"""

from .aggregator import Aggregator
from .client import Client
from .crypto import KEY_BYTES, NONCE_BYTES, advert_digest, prg, verify_advert
from .params import MAX_BITS, SecAggParams, check_capacity, graph_seed, modulus_bits, neighbours
from .protocol import KIND_B, KIND_SK, Advert, SecAggAbort, Stage, UnmaskRequest

__all__ = [
    "KEY_BYTES", "KIND_B", "KIND_SK", "MAX_BITS", "NONCE_BYTES", "Advert", "Aggregator", "Client",
    "SecAggAbort", "SecAggParams", "Stage", "UnmaskRequest", "advert_digest", "check_capacity",
    "graph_seed", "modulus_bits", "neighbours", "prg", "verify_advert",
]
