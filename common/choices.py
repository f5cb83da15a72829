"""The public names and defaults that the command line shows in its ``--help`` before it loads
anything heavy: numpy, scipy, grpc and the mechanisms import only inside the commands that use
them, so ``fedsketch --help`` and ``fedsketch device budget`` start at once. Each constant is
defined here once and re-exported by the module it belongs to (named on each)."""

from __future__ import annotations

#: Feature maps (:mod:`fedsketch.common.features`): f(t) = e^{it}, or its quantized ±1 ± i.
FEATURES: tuple[str, ...] = ("complex", "quantized")
#: Frequency radius laws (:mod:`fedsketch.common.sketch.frequencies`).
LAWS: tuple[str, ...] = ("gaussian", "folded_gaussian", "adapted_radius")
#: The neighbouring relations (:mod:`fedsketch.common.dp.calibration`; Dwork–Roth 2014 §2.3):
#: replace one record (n public) or add/remove one.
NEIGHBOURING: tuple[str, ...] = ("replace_one", "add_remove")
#: Default public search range of σ, in multiples of the public box's mean half-width h̄
#: (:func:`fedsketch.common.sketch.scale.default_range`): [h̄/60, 5h̄/3], two decades, which is the
#: [0.1, 10] every release used before the range followed the box, on the ±6 box of
#: standardized data (so those results are unchanged), and follows the data's units otherwise.
RANGE_PER_HALF_WIDTH = (1.0 / 60.0, 5.0 / 3.0)
#: Entries per record every command defaults to (``--r``): at n = 10^7 paper 004
#: (docs/REFERENCES.md, Fig. 1) finds r = 1 as accurate as r = m, at 1/m of the device's work,
#: and the L1 sensitivity of the integer release grows with r (Δ1 = 2rκ under replace-one).
DEFAULT_R = 1
#: m of ``fedsketch sketch`` and ``fedsketch.sketch`` when neither m nor k is given: with no k
#: there is nothing to plan m for (:mod:`fedsketch.common.study.sizing` plans it from k).
UNPLANNED_M = 1000

#: Default collection window (seconds after the quorum registered) of a plain study created from
#: the CLI (:mod:`fedsketch.common.study.study`): long enough for devices that poll every few minutes to
#: sketch and send, short enough that a roster device that never sends holds nobody's result for
#: long.
COLLECT_SECONDS = 3600.0
#: Default deadline (seconds after creation) of a plain study created from the CLI: a study whose
#: quorum never registers (too few devices enrolled, or too many refused) ends FAILED after a
#: week instead of staying open for ever and holding the reservations of the devices that joined.
DEADLINE_SECONDS = 7 * 86400.0
#: ``max_device_records`` of a study created without one (:meth:`StudySpec.create`; under secure
#: aggregation at most its total ``max_records``): the most records one device may declare, so
#: the most weight one device, hostile or not, carries in a plain study's average (a secure
#: study's inputs are bounded by the aggregate check: docs/bounded-influence.md).
DEFAULT_MAX_DEVICE_RECORDS = 1_000_000

#: The default per-device cap over the records a device is expected to hold (the study's public
#: expectation, e.g. the planner's N/L): a device may hold up to this many times its share.
CAP_HEADROOM = 4

#: Default collection window of one refinement round (seconds; :mod:`fedsketch.common.study.refine`):
#: it closes earlier once its roster has sent.
ROUND_SECONDS = 900.0
#: Defaults of a new study, chosen by measurement (benchmarks/RESULTS.md §8): three rounds
#: (two over-seeded and a last step; with two, the over-seeded round is reduced at once and
#: loses) taking 0.8 of the study's ε together, the sketch the rest.
ROUNDS = 3
ROUND_SHARE = 0.8
#: The rounds' share of a study's ε (after round 0) when its sketch is planned blind (no centroid
#: visible at any size, :func:`fedsketch.common.study.sizing.blind`) and the operator set no
#: share: the sketch keeps 5 %, the least that still publishes the k centres the first round
#: starts beside the packed ones. digits (1,797 records, d = 64, k = 10, ε = 1, three rounds, one
#: device, 3 seeds): relative SSE 2.00–2.20 against 2.12–2.57 at 0.8 (RESULTS.md §13).
BLIND_ROUND_SHARE = 0.95
#: A round's sums are of each record's offset from its cell's centre, clipped to ±ROUND_RADIUS·h_l
#: (h the box half-widths): the noise of the sums scales with the radius, clipping biases only
#: the records that far from their centre. Half the half-width: on diamonds (ε = 0.5, L = 100,
#: secure) the median relative SSE went from 1.11 to 1.04, flights unchanged (RESULTS.md §8).
ROUND_RADIUS = 0.5
#: Share of a federated study's ε that its ``--scale auto`` round 0 (the calibration release,
#: :mod:`fedsketch.common.study.calibration_round`) takes by default, as ``sketch --auto-fraction``.
AUTO_FRACTION = 0.1
#: Share of a local run's ε that ``--bounds auto`` spends on the private box (the sketch's two
#: histograms, :mod:`fedsketch.common.sketch.private_box`).
BOX_FRACTION = 0.1
#: Share of a federated study's ε that its box round (``create-study``/``simulate --bounds
#: auto``, :mod:`fedsketch.common.study.box_plan`) takes by default. The round keeps a bin of
#: τ ≈ (2d/ε_b)·ln(3.8·10⁶·d) records (d = 3: ≈ 490 at ε_b = 0.2, 980 at 0.1): 0.2 keeps
#: nycflights13's 709 Honolulu/Anchorage flights (0.22 %), 0.1 clipped them and held the study
#: at relative SSE 1.137 (RESULTS.md §12, "A far cluster and the box round").
BOX_ROUND_FRACTION = 0.2

#: The stages of secure aggregation, in order: the values of
#: :class:`fedsketch.common.secagg.protocol.Stage` (tests/test_cli_startup.py holds them equal).
SECAGG_STAGES: tuple[str, ...] = ("advertise_keys", "share_keys", "masked_input", "consistency", "unmask")
