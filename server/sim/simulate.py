"""``fedsketch simulate``: a real coordinator and L real devices over loopback gRPC with TLS.

Data come from paper 004's protocol (k unit-covariance Gaussians, centres ~ N(0, (s·k^{1/d})²I),
public box ±``bound``), or from a data file (``--data``, with the operator's public box
``--bounds``), pooled N records split across L devices: ``iid`` (a uniform random split into
near-equal parts) or ``dirichlet:ALPHA`` (each cluster's records split over the devices by
proportions drawn from Dir(ALPHA·1_L); small ALPHA gives devices few clusters each; every device
keeps at least one record). A data file's clusters are those of the k-means reference on the
pooled records: the simulator's own view, used only to deal the records out.

A fresh CA and server certificate, a SQLite store and a coordinator are made in a temporary folder; an
operator issues L enrollment tokens and creates one study (quorum L, no deadline). Devices then run the
real device code: in-process agents by default, or real ``fedsketch device run --once`` processes with
``--processes``. The coordinator aggregates at quorum and decodes; the result is scored by relative SSE
against scikit-learn KMeans (k-means++, n_init = 3) on the pooled data.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np

from fedsketch.client.ledger_records import LedgerError
from fedsketch.common.choices import CAP_HEADROOM
from fedsketch.common.data.dataio import DataSource, load_all
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.dp.lloyd import nearest
from fedsketch.common.features import FEATURES
from fedsketch.common.net.tls import CertPaths, init_certs, secure_channel, server_tls
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.box_split import PLACEHOLDER_RANGE, split_box, widest
from fedsketch.common.study.calibration_round import split_auto
from fedsketch.common.study.sizing import plan_study
from fedsketch.common.study.study import StudySpec
from fedsketch.common.study.validated import validity_delta
from fedsketch.server.bench.metrics import sklearn_kmeans_centroids, split, sse_per_n
from fedsketch.server.service.api import build_server
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.sim.config import BACKENDS, SimConfig, round0_range, used_config
from fedsketch.server.sim.devices import DROPOUT_STAGES, drive, make_agents, step_agents
from fedsketch.server.sim.helper_process import start_helper, validation_report
from fedsketch.server.sim.hostile import defences, hostile_indices, hostile_parts, parse_hostile, plain_passes
from fedsketch.server.sim.timeouts import default_stage_timeout
from fedsketch.server.store import Store, open_store

OPERATOR_TOKEN = "simulation-operator-token"
#: Longest wait (seconds) for a study to be decoded after the last contribution.
DECODE_TIMEOUT = 600.0
#: Bad input a simulation may raise besides ValueError and OSError: its devices' ledger refusals.
EXPECTED_ERRORS: tuple[type[Exception], ...] = (LedgerError,)


def split_records(labels: np.ndarray, devices: int, scheme: str,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Record indices of each device under ``iid`` or ``dirichlet:ALPHA`` (module docstring)."""
    n = labels.size
    if devices > n:
        raise ValueError(f"{devices} devices need at least as many records, got {n}")
    if scheme == "iid":
        return np.array_split(rng.permutation(n), devices)
    if not scheme.startswith("dirichlet:"):
        raise ValueError(f"--partition must be iid or dirichlet:ALPHA, got {scheme!r}")
    try:
        alpha = float(scheme.split(":", 1)[1])
    except ValueError:
        raise ValueError(f"--partition dirichlet:ALPHA needs a number, got {scheme!r}") from None
    if not alpha > 0:
        raise ValueError(f"the Dirichlet concentration must be > 0, got {alpha}")
    order = rng.permutation(n)
    parts: list[list[np.ndarray]] = [[order[i:i + 1]] for i in range(devices)]
    rest = order[devices:]
    for c in np.unique(labels[rest]):
        idx = rest[labels[rest] == c]
        cuts = (np.cumsum(rng.dirichlet(np.full(devices, alpha)))[:-1] * idx.size).astype(int)
        for part, chunk in zip(parts, np.split(idx, cuts), strict=True):
            part.append(chunk)
    return [np.concatenate(p) for p in parts]


def _study_spec(cfg: SimConfig, cap: int | None = None) -> StudySpec:
    """The simulated study; ``cap`` its max_device_records (default: N, any split)."""
    box_plan, rest, lo_hi = None, cfg.epsilon, cfg.public_box
    if cfg.auto_box:  # the study's box round (--bounds auto) reads the box first
        box_plan, rest = split_box(cfg.epsilon, cfg.box_fraction, cfg.scale_range is None)
        lo_hi = widest(cfg.d)
    searched = PLACEHOLDER_RANGE if cfg.auto_box and cfg.scale_range is None else round0_range(cfg)
    plan, rest = (None, rest) if cfg.scale is not None else split_auto(rest, searched)
    planned = plan_study(rest, cfg.rounds, cfg.records / cfg.devices, cfg.devices, cfg.d, cfg.k, m=cfg.m,
                         round_share=cfg.round_share, neighbouring=cfg.neighbouring, feature=cfg.feature,
                         secure=cfg.secure_aggregation)
    sketch_eps, refine = planned.sketch_epsilon, planned.refine
    sketch = SketchSpec(FrequencySpec(d=cfg.d, m=planned.m, seed=cfg.seed,
                                      scale=cfg.scale if plan is None else plan.placeholder),
                        cfg.feature, cfg.r, PrivacySpec(sketch_eps, cfg.delta, cfg.neighbouring))
    secure = None
    if cfg.secure_aggregation:
        dropout = cfg.dropout if cfg.max_dropout is None else cfg.max_dropout
        trust = Assumptions.from_fractions(cfg.devices, dropout, cfg.max_colluders)
        timeout = cfg.stage_timeout or default_stage_timeout(cfg.devices, cfg.validation is not None)
        secure = SecAggSpec.assuming(trust, cfg.records, cfg.degree, timeout, cfg.threshold)
    elif cfg.validation is not None:
        raise ValueError("--validation helper validates a secure study: add --secure-aggregation")
    elif cfg.dropout:
        raise ValueError("--dropout simulates secure-aggregation dropouts: add "
                         "--secure-aggregation")
    elif (cfg.threshold, cfg.max_dropout, cfg.degree) != (None, None, None) or cfg.max_colluders:
        raise ValueError("--threshold, --max-dropout, --max-colluders and --degree apply to "
                         "--secure-aggregation only")
    if not 0 <= cfg.dropout < 1 or cfg.dropout_stage not in DROPOUT_STAGES:
        raise ValueError(f"--dropout must be in [0, 1) and --dropout-stage one of "
                         f"{', '.join(DROPOUT_STAGES)}")
    hostile = parse_hostile(cfg.hostile, cfg.devices)
    plain_hostile = hostile is not None and secure is None  # a quorum of the honest, closed by hand
    spec = StudySpec.create("simulation", sketch, cfg.k, *lo_hi,
                            min_devices=cfg.devices - (hostile[0] if plain_hostile else 0),
                            roster=cfg.devices if plain_hostile else None,
                            deadline=time.time() + DECODE_TIMEOUT if plain_hostile else None,
                            replicates=cfg.replicates, decode_seed=cfg.seed,
                            secure_aggregation=secure, refine=refine, calibration=plan,
                            box=box_plan, max_device_records=cfg.records if cap is None else cap)
    spec.check_new()
    return spec


@dataclass(frozen=True)
class Loopback:
    """A running coordinator on 127.0.0.1 over TLS, and an operator's stub and credential."""

    target: str
    certs: CertPaths
    store: Store
    coordinator: Coordinator
    channel: grpc.Channel
    operator: pb_grpc.OperatorStub
    meta: tuple[tuple[str, str], ...]


def loopback_coordinator(stack: ExitStack, folder: Path, host: str = "127.0.0.1",
                         helper_token: str | None = None) -> Loopback:
    """A fresh CA and server certificate, a SQLite store and a coordinator in ``folder``,
    listening on a free port of ``host`` (loopback unless a Ray cluster's devices must reach
    it), showing ``helper_token`` to a validated study's helper; ``stack`` stops and closes
    everything."""
    names = ["localhost", "127.0.0.1"] + ([] if host == "127.0.0.1" else [host])
    certs = init_certs(folder / "certs", names)
    store = open_store(folder / "coordinator.db")
    stack.callback(store.close)
    server, coordinator, port = build_server(
        store, hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(), f"{host}:0",
        server_tls(certs.server_cert, certs.server_key), helper_token=helper_token)
    stack.callback(coordinator.stop)
    stack.callback(lambda: server.stop(grace=None).wait())
    target = f"localhost:{port}" if host == "127.0.0.1" else f"{host}:{port}"
    channel = secure_channel(target, certs.ca_cert)
    stack.callback(channel.close)
    return Loopback(target, certs, store, coordinator, channel, pb_grpc.OperatorStub(channel),
                    (("authorization", f"Bearer {OPERATOR_TOKEN}"),))


def wait_for(watch: Callable[[], pb.Study], states: tuple[int, ...], what: str,
             poll: float) -> pb.Study:
    """Poll ``watch`` every ``poll`` seconds until the study is in one of ``states``; RuntimeError
    ("{what} in time") after DECODE_TIMEOUT seconds."""
    stop = time.monotonic() + DECODE_TIMEOUT
    while (s := watch()).state not in states:
        if time.monotonic() > stop:
            raise RuntimeError(f"{what} in time")
        time.sleep(poll)
    return s


def _processes(target: str, ca: Path, folder: Path, tokens: list[str], x: np.ndarray,
               parts: list[np.ndarray], epsilon: float, cfg: SimConfig,
               watch: Callable[[], pb.Study]) -> None:
    """Real ``fedsketch device run`` processes: polling daemons (a plain round's roster fills
    on a first pass, its input comes on a later one), stopped with SIGTERM once the study is
    closed (with later rounds: once it ends)."""
    exe = str(Path(sys.executable).with_name("fedsketch"))
    procs = []
    for i, (token, idx) in enumerate(zip(tokens, parts, strict=True)):
        path = folder / f"device{i}.npy"
        np.save(path, x[idx])
        procs.append(subprocess.Popen(
            [exe, "device", "run", "--coordinator", target, "--ca", str(ca), "--data", str(path),
             "--ledger", str(folder / f"device{i}.ledger"), "--budget", repr(epsilon),
             "--token", token, "--label", f"sim-{i}", "--poll", "0.1", "--max-poll", "0.5"]
            + (["--budget-delta", "1e-6"] if cfg.validation else []),  # a validated spend's δ
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    wait_for(watch, (pb.DONE, pb.FAILED) + (() if cfg.rounds or cfg.scale is None else (pb.DECODING,)),
             "the round did not finish", 0.1)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for i, p in enumerate(procs):
        _, stderr = p.communicate(timeout=DECODE_TIMEOUT)
        if p.returncode != 0:
            raise RuntimeError(f"device process {i} exited with {p.returncode}: {stderr[-500:]}")


@dataclass(frozen=True)
class Pooled:
    """The pooled records of a simulation and their k-means reference SSE/n (computed once,
    reusable across runs that differ only in the round's settings)."""

    x: np.ndarray
    labels: np.ndarray
    kmeans_sse_per_n: float


def pooled_data(cfg: SimConfig) -> Pooled:
    """Paper 004's data for ``cfg`` and the SSE/n of KMeans (k-means++, n_init = 3) on it."""
    x, labels, _ = gmm(cfg.records, cfg.k, cfg.d, cfg.separation, cfg.seed)
    return Pooled(x, labels, sse_per_n(split(x), sklearn_kmeans_centroids(x, cfg.k, cfg.seed)))


def file_data(data: str | Path | DataSource, k: int, seed: int) -> Pooled:
    """The records of a data file (a path, or an open source: :mod:`fedsketch.common.data.dataio`),
    their clusters under KMeans (k-means++, n_init = 3, ``seed``) for ``dirichlet`` partitions,
    and its SSE/n."""
    x = load_all(data).astype(np.float64)
    if x.shape[0] <= k:
        path = data.path if isinstance(data, DataSource) else data
        raise ValueError(f"{path}: {x.shape[0]} records cannot make {k} clusters")
    centroids = sklearn_kmeans_centroids(x, k, seed)
    labels, _ = nearest(x, centroids)
    return Pooled(x, labels, sse_per_n(split(x), centroids))


def run_simulation(cfg: SimConfig, data: Pooled | None = None) -> dict:
    """Run one simulated study end to end; a JSON-ready report (see the module docstring).
    ``data`` (from :func:`pooled_data` with the same records, k, d and seed) skips making the
    data and the reference."""
    if cfg.feature not in FEATURES:
        raise ValueError(f"unknown feature map {cfg.feature!r}")
    if cfg.devices < 1 or cfg.records < cfg.devices:
        raise ValueError("need at least one device and one record per device")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {cfg.backend!r}")
    if cfg.backend == "ray" and cfg.processes:
        raise ValueError("--processes runs daemon processes on this machine and --backend ray "
                         "runs the devices on Ray: choose one")
    if cfg.address is not None and cfg.backend != "ray":
        raise ValueError("--address names a Ray cluster: add --backend ray")
    spec = _study_spec(cfg)  # validates every parameter before any work
    if data is not None and data.x.shape != (cfg.records, cfg.d):
        raise ValueError(f"the records are {data.x.shape}, the configuration says "
                         f"({cfg.records}, {cfg.d})")
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    if data is None:
        data = pooled_data(cfg)
        seconds["data_and_kmeans_reference"] = time.perf_counter() - t
    x = data.x
    parts = split_records(data.labels, cfg.devices, cfg.partition,
                          np.random.default_rng(cfg.seed))
    cap = max(CAP_HEADROOM * -(-cfg.records // cfg.devices), max(p.size for p in parts))
    spec = _study_spec(cfg, cap)  # the cap of N/L, the public expectation (or the largest part)
    hostile = parse_hostile(cfg.hostile, cfg.devices)
    bad = ([], "") if hostile is None else (hostile_indices(cfg.devices, hostile[0]), hostile[1])
    if hostile is not None and (cfg.processes or cfg.backend != "inprocess"):
        raise ValueError("--hostile runs in-process devices: the daemon and the Ray backend have "
                         "no hostile mode")
    x, parts = hostile_parts(x, parts, *bad, cap)
    ray_report = None
    with tempfile.TemporaryDirectory(prefix="fedsketch-sim-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        t = time.perf_counter()
        host = "127.0.0.1"
        if cfg.backend == "ray":
            from fedsketch.server.sim.ray_devices import ray_session, run_on_ray
            host = stack.enter_context(ray_session(cfg.address))
        helper = None
        if cfg.validation == "helper":
            helper = start_helper(stack, folder / "helper")
            spec = helper.name_in(spec)
        loop = loopback_coordinator(stack, folder, host, None if helper is None else helper.token)
        store, target, operator, meta = loop.store, loop.target, loop.operator, loop.meta
        certs = loop.certs
        tokens = list(operator.IssueTokens(pb.IssueTokensRequest(count=cfg.devices),
                                           metadata=meta).tokens)
        study = operator.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()),
                                     metadata=meta)
        seconds["setup"] = time.perf_counter() - t
        def watch() -> pb.Study:
            return operator.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=meta)

        t, bytes_down = time.perf_counter(), None  # counted by in-process devices only
        if cfg.processes:
            _processes(target, certs.ca_cert, folder, tokens, x, parts, cfg.epsilon, cfg, watch)
            bytes_up = None if cfg.secure_aggregation else sum(
                pb.Contribution(study_id=r.study_id, device_id=r.device_id, n=r.n,
                                spec_sha256=study.spec_sha256, signature=r.signature,
                                **{r.kind: r.payload}).ByteSize()
                for r in store.contributions(study.study_id))
            seconds["devices"] = time.perf_counter() - t
        elif cfg.backend == "ray":
            ray_report = run_on_ray(target, certs.ca_cert, tokens, [x[idx] for idx in parts],
                                    cfg.epsilon, cfg, watch, seconds)
            bytes_up = ray_report.pop("bytes_sent")
        else:
            agents = make_agents(stack, target, certs.ca_cert, folder, tokens,
                                 [x[idx] for idx in parts], cfg.epsilon, hostile=bad,
                                 delta=validity_delta(spec) if helper else 0.0)
            seconds["enroll"] = time.perf_counter() - t
            t = time.perf_counter()
            if hostile is not None and not cfg.secure_aggregation:
                plain_passes(agents, watch, lambda sid: operator.CloseStudy(
                    pb.StudyRef(study_id=sid), metadata=meta))
            else:
                drive(step_agents(agents), len(agents), cfg, watch)
            bytes_up = sum(a.bytes_sent for a in agents)
            bytes_down = sum(a.bytes_received for a in agents)
            seconds["devices"] = time.perf_counter() - t
        t = time.perf_counter()
        s = wait_for(watch, (pb.DONE, pb.FAILED), "the coordinator did not finish decoding", 0.05)
        if s.state == pb.FAILED and hostile is None:
            raise RuntimeError(f"the study failed: {s.detail}")
        validated = validation_report(loop.coordinator.round_of(study.study_id), agents
                                      if not cfg.processes and cfg.backend == "inprocess" else [])
        defended = None if hostile is None else defences(
            bad[1], bad[0], {i: agents[i].refusals + validated["excluded"].get(i, [])
                             for i in bad[0]}, s.detail if s.state == pb.FAILED else None)
        if s.state == pb.FAILED:
            return {"relative_sse": None, "hostile": defended, "seconds": seconds,
                    "validation": validated["report"], "config": used_config(cfg, spec, None)}
        res = operator.GetResult(pb.StudyRef(study_id=study.study_id), metadata=meta)
        seconds["decode"] = time.perf_counter() - t
        full, rnd = json.loads(store.get_result(study.study_id)), loop.coordinator.round_of(study.study_id)
    x = data.x  # the honest records score the result
    centroids = np.asarray(res.centroids).reshape(res.k, res.d)
    ref = data.kmeans_sse_per_n
    sse = sse_per_n(split(x), centroids)
    refinement = None if spec.refine is None else {
        "rounds": spec.refine.rounds, "epsilon": list(spec.refine.epsilon),
        "sketch_epsilon": spec.sketch.privacy.epsilon, "refined_rounds": res.rounds,
        "start_relative_sse": sse_per_n(split(x), np.array(full["start_centroids"])) / ref,
        "round_states": [r["state"] for r in full["rounds"]]}
    return {
        "relative_sse": sse / ref,
        "refinement": refinement,
        "calibration": full.get("calibration"),
        "box": full.get("box"),
        "sse_per_n": sse,
        "kmeans_sse_per_n": ref,
        "centroids": centroids.tolist(),
        "weights": list(res.weights),
        "verdict": full.get("verdict"),
        "identifiability": {"status": res.status, "reason": res.status_reason, "z": list(res.z),
                            "threshold": res.threshold},
        "devices": res.devices,
        "records": res.records,
        "seconds": seconds,
        "bytes_sent": bytes_up,
        "bytes_received": bytes_down,
        "ray": ray_report,
        "secure_aggregation": None if spec.secure_aggregation is None else {
            **asdict(spec.secure_aggregation), "min_honest": spec.assumptions.min_honest,
            "stage_open_seconds": dict(getattr(rnd, "stage_open", {})),
            "stage_seconds": dict(getattr(rnd, "stage_seconds", {})),
            "stage_cpu_seconds": dict(getattr(rnd, "stage_cpu", {}))},
        "config": used_config(cfg, spec, full.get("calibration"), full.get("box")),
        "hostile": defended,
        "validation": validated["report"],
    }
