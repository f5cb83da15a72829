"""The simulator's default stage timeout for a secure round (``simulate --secure-aggregation``
without ``--stage-timeout``).

A device prepares its input (reads and sketches its data, draws its noise share) before it
registers (:mod:`fedsketch.client.secure_steps`), so a stage's time is network and crypto alone:
at most, per device, its X25519 agreements, Shamir shares and AES-GCM for its neighbours
(SHARE_KEYS), or its pair masks' keystreams (MASKED_INPUT), each an RPC over TLS on loopback.
The in-process simulator steps its L devices one after another, and its coordinator runs in the
same process, so a stage stays open about L times one device's step.

Measured (``python benchmarks/bench_secagg.py stages``: paper 004's data, N = 10^6, m = 1000,
complex map, ε = 0.5, full graph, no timeout reached; 2-core VM): the longest stage is
SHARE_KEYS, 0.44 s at L = 20 and 5.3 s at L = 100 with a load average of 4 from other jobs
(about 53 ms per device), and 29.5 s at L = 100 with four busy loops beside it and a load
average of 12 (about 0.3 s per device; docs/secure-aggregation.md has every stage). The device's
ledger commits (fsync) and its RPCs to a coordinator in the same process dominate, not the
crypto. The default allows :data:`SECONDS_PER_DEVICE` = 2 s per device, about 7 times the
loaded figure and 38 times the other, and at least :data:`MIN_STAGE_TIMEOUT` seconds. A stage
with devices that really drop out (``--dropout``) waits the whole timeout: pass a shorter
``--stage-timeout`` to simulate those quickly.

A study validated by a helper (``--validation helper``) proves each input at MASKED_INPUT: 0.3 s
of CPU per device at m = 1000 with the L1 bound's encoding left out (measured beside a load
average of 10 on 2 cores), and the uploads are 480 kB; :data:`PROOF_SECONDS_PER_DEVICE` = 10 s
per device more, about 30 times that CPU figure, covers a loaded machine (a first run with the
plain default timed out two of 20 devices at a load average of 11).
"""

from __future__ import annotations

#: Seconds of stage timeout per simulated device (module docstring).
SECONDS_PER_DEVICE = 2.0
#: Fewest seconds of the default stage timeout.
MIN_STAGE_TIMEOUT = 30.0
#: Seconds more per device when every input is proven (module docstring).
PROOF_SECONDS_PER_DEVICE = 10.0


def default_stage_timeout(devices: int, validated: bool = False) -> float:
    """The stage timeout (seconds) of a simulated secure round of ``devices`` devices:
    max(:data:`MIN_STAGE_TIMEOUT`, :data:`SECONDS_PER_DEVICE` · L), plus
    :data:`PROOF_SECONDS_PER_DEVICE` · L when the inputs are proven (``validated``)."""
    return (max(MIN_STAGE_TIMEOUT, SECONDS_PER_DEVICE * devices)
            + (PROOF_SECONDS_PER_DEVICE * devices if validated else 0.0))
