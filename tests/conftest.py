"""Shared fixtures: a real coordinator over TLS on loopback, with a real SQLite store, and a real
PostgreSQL server for the session with a fresh database per test (:mod:`pgtest`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from fedsketch.client.agent import Agent
from fedsketch.client.ledger import Ledger
from fedsketch.client.localdata import LocalData
from fedsketch.common.net.device_reads import signed_read
from fedsketch.common.net.tls import CertPaths, init_certs, secure_channel, server_tls
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.server.bench.metrics import split
from fedsketch.server.service.api import build_server
from fedsketch.server.service.coordinator import Coordinator
from fedsketch.server.store import Store, open_store

OPERATOR_TOKEN = "test-operator-token"
META = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)


@pytest.fixture(autouse=True)
def _grpc_verbosity_restored():
    """The CLI sets GRPC_VERBOSITY=NONE in its own process for the processes it starts; a test
    that runs the CLI in the test's process (typer's CliRunner) would pass it on to every later
    test's subprocess in the same worker, and a test that a process silences gRPC by itself would
    then pass whatever the product does. Each test leaves it as it found it."""
    before = os.environ.get("GRPC_VERBOSITY")
    yield
    if before is None:
        os.environ.pop("GRPC_VERBOSITY", None)
    else:
        os.environ["GRPC_VERBOSITY"] = before


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> CertPaths:
    return init_certs(tmp_path_factory.mktemp("certs"), ["localhost", "127.0.0.1"])


@pytest.fixture(scope="session")
def cli_certs(tmp_path_factory) -> Path:
    """The folder of a CA and a server certificate for localhost and 127.0.0.1 (ca.pem,
    server.pem, server.key), made once for the session by ``fedsketch certs init`` as an operator
    makes them; the process tests' coordinators serve with it and their devices trust its ca.pem.
    Read only: a test that needs other certificates makes its own."""
    folder = tmp_path_factory.mktemp("cli-certs") / "certs"
    subprocess.run([str(Path(sys.executable).with_name("fedsketch")), "certs", "init", "--out", str(folder),
                    "--host", "localhost", "--host", "127.0.0.1"], check=True, capture_output=True,
                   timeout=120)
    return folder


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the whole run (for each worker under pytest-xdist), started on first
    use, stopped at the end."""
    from pgtest import TestServer

    server = TestServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of an empty database of its own for this test (dropped after it)."""
    name = postgres_server.fresh_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


#: Where a fresh store of each backend lives, by name: every store test runs on each.
BACKENDS = {
    "sqlite": lambda request, tmp_path: f"sqlite:///{tmp_path / 'store.db'}",
    "postgres": lambda request, tmp_path: request.getfixturevalue("postgres_url"),
}


@pytest.fixture(params=sorted(BACKENDS))
def store_url(request, tmp_path) -> str:
    """Where an empty store lives, once for each backend."""
    return BACKENDS[request.param](request, tmp_path)


@pytest.fixture
def store(store_url) -> Store:
    """An empty store, once for each backend."""
    s = open_store(store_url)
    yield s
    s.close()


@dataclass
class Round:
    """A running coordinator and helpers to drive it."""

    target: str
    certs: CertPaths
    store: Store
    coordinator: Coordinator
    folder: Path

    def channel(self) -> grpc.Channel:
        return secure_channel(self.target, self.certs.ca_cert)

    def operator(self) -> pb_grpc.OperatorStub:
        return pb_grpc.OperatorStub(self.channel())

    def device_stub(self) -> pb_grpc.DeviceStub:
        return pb_grpc.DeviceStub(self.channel())

    def tokens(self, count: int) -> list[str]:
        return list(self.operator().IssueTokens(pb.IssueTokensRequest(count=count),
                                                metadata=META).tokens)

    def create(self, spec: StudySpec) -> pb.Study:
        return self.operator().CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()),
                                           metadata=META)

    def agent(self, name: str, x: np.ndarray, budget: float = 1000.0) -> Agent:
        """An enrolled in-process device holding ``x``, with its own ledger."""
        data = LocalData(lambda: split(x), x.shape[1])
        agent = Agent(self.channel(), Ledger.create(self.folder / f"{name}.ledger", budget),
                      lambda: data)
        agent.ensure_enrolled(self.target, self.tokens(1)[0], name)
        return agent

    def result(self, study_id: str) -> pb.Result:
        """The study's published result, read with the operator's credential."""
        return self.operator().GetResult(pb.StudyRef(study_id=study_id), metadata=META)

    def wait(self, study_id: str, timeout: float = 120.0) -> pb.Study:
        """The study once it is done or failed."""
        stop = time.monotonic() + timeout
        while time.monotonic() < stop:
            s = self.operator().ShowStudy(pb.StudyRef(study_id=study_id), metadata=META)
            if s.state in (pb.DONE, pb.FAILED):
                return s
            time.sleep(0.05)
        raise TimeoutError(study_id)


@pytest.fixture
def coordinator_round(tmp_path, certs) -> Round:
    store = open_store(tmp_path / "coordinator.db")
    server, coordinator, port = build_server(
        store, hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(), "127.0.0.1:0",
        server_tls(certs.server_cert, certs.server_key))
    try:
        yield Round(f"localhost:{port}", certs, store, coordinator, tmp_path)
    finally:
        server.stop(grace=None).wait()
        coordinator.stop()
        store.close()


def study_spec(d: int = 3, k: int = 3, m: int = 60, epsilon: float = 50.0,
               feature: str = "complex", r: int | None = None,
               neighbouring: str = "replace_one", name: str = "test", **rules) -> StudySpec:
    """A small study over [−10, 10]^d."""
    sketch = SketchSpec(FrequencySpec(d=d, m=m, scale=1.5, seed=1), feature, m if r is None else r,
                        PrivacySpec(epsilon, 0.0, neighbouring))
    return StudySpec.create(name, sketch, k, [-10.0] * d, [10.0] * d, replicates=2, **rules)


def signed(agent: Agent, method: str, study_id: str = "", at: float | None = None) -> pb.DeviceRead:
    """The agent's device read of ``method`` ("ListStudies", "GetStudy", "GetResult"; study_id ""
    for a list), signed with its enrolled key now (or at ``at``, Unix seconds)."""
    identity = agent.ledger.identity()
    return signed_read(identity.private_key, identity.device_id, identity.coordinator, method,
                       study_id, at)


#: Bound at import: a test may disable numpy's generators to show that privacy noise never uses them.
_GENERATOR = np.random.Generator


def seeded_words(seed: int):
    """A deterministic stand-in for :func:`fedsketch.common.dp.exact.random_words`: uint64 words
    of PCG64(seed), so that a test can replay the exact samplers' bits."""
    state = _GENERATOR(np.random.PCG64(seed))
    return lambda count: state.integers(0, 2**64, count, dtype=np.uint64)


def contribute_all(agents, study_id: str, passes: int = 5) -> None:
    """Step every agent until each has submitted to ``study_id``: a plain study's first pass
    fills its roster (the device that fills it contributes at once), a later one takes the
    input. AssertionError if some device has not after ``passes`` passes."""
    pending = list(agents)
    for _ in range(passes):
        pending = [a for a in pending if study_id not in a.step().submitted]
        if not pending:
            return
    raise AssertionError(f"{len(pending)} devices did not contribute to {study_id}")


def dlap_variance_check(noise: np.ndarray, epsilon: float, delta1: float) -> None:
    """Assert that ``noise`` (int draws) has the mean 0 and variance 2a/(1 − a)² of DLap(a), a =
    e^{−ε/Δ1}, each within 6 standard errors (a Δ1 or ε off by a factor 2 moves the variance
    about 4×): the private box's releases, central or summed across devices."""
    noise = np.asarray(noise).ravel()
    a = np.exp(-epsilon / delta1)
    var = 2 * a / (1 - a) ** 2
    fourth = np.mean(noise.astype(float) ** 4)
    se = np.sqrt((fourth - var**2) / noise.size)
    assert abs(noise.var() - var) < 6 * se, (noise.var(), var, se)
    assert abs(noise.mean()) < 6 * np.sqrt(var / noise.size)


def histogram_audit(noise, size: int = 400_000) -> float:
    """Clopper–Pearson lower bound (α = 10⁻⁶) on the ε of a one-column histogram release under
    replace-one whose counts get ``noise((4, size))`` (int draws): D's record in bin A (counts
    (1, 0)), D′'s in bin B ((0, 1)). The likelihood-ratio-optimal event {count_A ≥ 1, count_B ≤
    0} has the loss ε exactly for DLap noise of the claimed scale."""
    from scipy.stats import beta

    draws = noise((4, size))
    hits = int(np.sum((draws[0] + 1 >= 1) & (draws[1] <= 0)))
    hits_prime = int(np.sum((draws[2] >= 1) & (draws[3] + 1 <= 0)))
    p_lo = beta.ppf(1e-6 / 2, hits, size - hits + 1)
    p_hi = beta.ppf(1 - 1e-6 / 2, hits_prime + 1, size - hits_prime)
    return float(np.log(p_lo / p_hi))


@pytest.fixture(scope="module")
def cluster():
    """A real local Dask cluster of two single-threaded worker processes (its scheduler's
    address); the tests that take it skip without the dask extra."""
    distributed = pytest.importorskip("dask.distributed", reason="the dask extra is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as local:
        yield local.scheduler_address


#: The suite's longest files, longest first: seconds of one worker each in a full `make test`
#: run on the quiet 2-core machine (2 Dec 2026, after the in-process operator commands and the
#: smaller smoke runs; 10 min 58 s in all): 266, 111, 102, 85, 63, 50, 47, 46, 42, 36, 34, 33,
#: 33, 32, 31, 30, 28, 28, 26, 26, 24, 23, 23, 22, 22, 22, 21, 20. test_secure_void.py is mostly
#: waits for its 15 s stage timeouts (29 CPU s), so it starts first and overlaps the rest.
#: ``--dist loadfile --no-loadscope-reorder`` (``make test``) hands files to workers in collection
#: order; these go first, so that the short files fill the workers at the end (longest-first
#: scheduling) instead of one long file starting last and ending the run alone. Without
#: ``--no-loadscope-reorder`` pytest-xdist (3.x) re-sorts the files by their number of tests and
#: this order is lost. A file missing from the list only runs in its place.
LONGEST_FIRST = (
    "test_secure_void.py", "test_benchmarks.py", "test_doc_blocks.py", "test_secagg_round.py",
    "test_secure_crash.py", "test_simulate_ray.py", "test_shared_crash_cycles.py",
    "test_doc_blocks_operator.py", "test_store_faults.py", "test_declared_budget.py",
    "test_box_round_processes.py", "test_zero_knowledge.py", "test_secure_charges.py",
    "test_secure_left.py", "test_kmeans.py", "test_simulate.py", "test_refine_processes.py",
    "test_console_health.py", "test_blas_kernels.py", "test_fuzz_api.py", "test_privacy.py",
    "test_ckm.py", "test_kernels_uncached.py", "test_round_processes.py",
    "test_validated_simulate.py", "test_secure_late_devices.py", "test_postgres_processes.py",
    "test_device_dask.py",
)


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (``LONGEST_FIRST``), the rest in collection order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
