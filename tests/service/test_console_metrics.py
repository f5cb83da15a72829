"""``coordinator serve --metrics``: a real coordinator process (TLS on loopback) and four real
device daemons run a plain study and a secure-aggregation study while the test scrapes
``/metrics`` over HTTP, parsed with prometheus-client's own parser. The contribution counter,
the study-state gauge and the secure stage histogram move as the studies run; RPCs are counted
by method and status code; no label carries a device id, a study id or anything else a client
chooses. The console's page of the secure study (``--console``) follows its stages while it runs
and shows the four devices in its sum once it ended."""

from __future__ import annotations

import re
import signal
import socket
import sqlite3
import ssl
import subprocess
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_round_processes import FEDSKETCH, CoordinatorProcess, create_study

from fedsketch.common.data.synthetic import gmm
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.secagg import wire as sw
from fedsketch.common.secagg.spec import SecAggSpec
from fedsketch.common.secagg.trust import Assumptions
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec
from fedsketch.server.store.base import KINDS, STATES

pytestmark = pytest.mark.slow
DEVICES = 4
#: Every label name a coordinator's metrics may carry (``le``: a histogram's bucket).
LABELS = {"method", "code", "kind", "stage", "reason", "operation", "state", "le"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of ``/metrics``: (name, sorted labels) → value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def studies(samples: dict) -> dict[str, float]:
    return {state: total(samples, "fedsketch_studies", state=state) for state in STATES}


def create_secure(c: CoordinatorProcess) -> str:
    """A secure study of the four devices (no dropout or colluder assumed), over gRPC."""
    sketch = SketchSpec(FrequencySpec(d=3, m=100, scale=1.5, seed=0), "complex", 1, PrivacySpec(1.0))
    sa = SecAggSpec.assuming(Assumptions(DEVICES, 0, 0), 100_000, None, 120.0)
    spec = StudySpec.create("secure", sketch, 3, [-12.0] * 3, [12.0] * 3, min_devices=DEVICES,
                            replicates=2, secure_aggregation=sa)
    return c.create(spec)


def test_metrics_move_while_a_plain_and_a_secure_study_run(tmp_path, cli_certs):
    port, console = free_port(), free_port()
    c = CoordinatorProcess(tmp_path, cli_certs, "--metrics", f"127.0.0.1:{port}",
                           "--console", f"127.0.0.1:{console}")
    c.start()
    https = ssl.create_default_context(cafile=str(cli_certs / "ca.pem"))

    def page(study: str) -> str:
        """The console's page of ``study`` (the operator token as a bearer header)."""
        request = urllib.request.Request(f"https://localhost:{console}/study/{study}", headers={
            "Authorization": f"Bearer {c.token_file.read_text().strip()}"})
        return urllib.request.urlopen(request, timeout=30, context=https).read().decode()

    daemons = []
    try:
        before = scrape(port)
        assert total(before, "fedsketch_contributions_total") == 0
        assert studies(before) == dict.fromkeys(STATES, 0)
        assert total(before, "fedsketch_devices_enrolled") == 0
        assert total(before, "fedsketch_store_healthy") == 1
        assert total(before, "fedsketch_secure_stage_seconds_count") == 0

        plain, secure = create_study(c, DEVICES), create_secure(c)
        assert studies(scrape(port))["open"] == 2
        tokens = c.op("tokens", "--count", str(DEVICES)).stdout.split()
        x, _, _ = gmm(20_000, 3, 3, 3.0, seed=4)
        for i, (part, token) in enumerate(zip(np.array_split(x, DEVICES), tokens, strict=True)):
            np.save(tmp_path / f"x{i}.npy", part)
            daemons.append(subprocess.Popen(
                [FEDSKETCH, "device", "run", "--coordinator", c.target, "--ca", str(cli_certs / "ca.pem"),
                 "--data", str(tmp_path / f"x{i}.npy"), "--ledger", str(tmp_path / f"ledger{i}"),
                 "--budget", "100", "--token", token, "--poll", "0.4", "--max-poll", "0.4"],
                stdout=subprocess.DEVNULL, stderr=(tmp_path / f"device{i}.log").open("w")))
        seen, stages, stop = [], set(), time.monotonic() + 300  # generous: two studies, a loaded machine
        while (now := scrape(port)) and studies(now)["done"] < 2:
            assert time.monotonic() < stop, (studies(now), c.log.read_text()[-2000:])
            seen.append(studies(now))
            stages |= set(re.findall(r"<td>secure stage</td><td>([A-Z_]+)</td>", page(secure)))
            time.sleep(0.2)
        # the decode histogram is observed just after the store's DONE commit the gauge reads:
        # give it a moment (it must still reach 2, or the assertion below fails)
        settle = time.monotonic() + 30
        while total(now, "fedsketch_decode_seconds_count") < 2 and time.monotonic() < settle:
            time.sleep(0.1)
            now = scrape(port)
        after = now
        # the console followed the round's stages, and shows who is in its sum
        assert stages and stages <= {pb.Stage.Name(s) for s in sw.STAGES}
        assert f"<td>in the sum</td><td>{DEVICES} of {DEVICES} devices" in page(secure)

        # the contribution counter: the plain study's four, by payload kind
        assert total(after, "fedsketch_contributions_total") == DEVICES
        kinds = {dict(ls)["kind"] for (n, ls), v in after.items()
                 if n == "fedsketch_contributions_total" and v}
        assert kinds and kinds <= set(KINDS)
        # the study-state gauge: from two open to two done, through states in between
        assert studies(after) == {**dict.fromkeys(STATES, 0), "done": 2}
        assert any(s["collecting"] or s["decoding"] for s in seen)
        assert total(after, "fedsketch_devices_enrolled") == DEVICES
        # the secure stage histogram: each stage of the one round closed once, nobody dropped
        for stage in sw.STAGES:
            assert total(after, "fedsketch_secure_stage_seconds_count", stage=pb.Stage.Name(stage)) == 1
            assert total(after, "fedsketch_secure_messages_total", stage=pb.Stage.Name(stage)) == DEVICES
        assert total(after, "fedsketch_secure_dropouts_total") == 0
        assert total(after, "fedsketch_decode_seconds_count") == 2
        # RPCs by method and code, and store latency by operation
        assert total(after, "fedsketch_rpcs_total", method="Device/Submit", code="OK") >= DEVICES
        assert total(after, "fedsketch_rpcs_total", method="Operator/CreateStudy", code="OK") == 2
        assert total(after, "fedsketch_store_seconds_count", operation="add_contribution") >= DEVICES

        # labels: closed sets only, never an id
        with sqlite3.connect(c.db) as db:
            ids = {d for (d,) in db.execute("SELECT device_id FROM devices")} | {plain, secure}
        assert len(ids) == DEVICES + 2
        for name, labels in after:
            assert {k for k, _ in labels} <= LABELS, name
            for key, value in labels:
                assert not any(i in value for i in ids), (name, labels)
                if key == "method":
                    assert re.fullmatch(r"(Device|Operator|Health)/[A-Za-z]+", value), value
    finally:
        for d in daemons:
            d.send_signal(signal.SIGTERM)
        for d in daemons:
            d.wait(timeout=30)
        if c.proc.poll() is None:
            assert c.terminate() == 0


def test_serve_refuses_a_bad_or_busy_console_address_in_one_line(tmp_path):
    """A malformed address is refused before the store is created; a busy one names its option."""
    serve = [FEDSKETCH, "coordinator", "serve", "--insecure", "--listen", "127.0.0.1:0",
             "--token-file", str(tmp_path / "operator.token")]
    for option in ("--metrics", "--console"):
        db = tmp_path / f"bad{option}.db"
        res = subprocess.run([*serve, "--db", str(db), option, "no-port"], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 1 and res.stderr == f"error: {option} 'no-port': give HOST:PORT, e.g. " \
            "127.0.0.1:9464\n"
        assert not db.exists()
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            address = f"127.0.0.1:{busy.getsockname()[1]}"
            res = subprocess.run([*serve, "--db", str(tmp_path / f"busy{option}.db"), option, address],
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 1
        assert res.stderr.splitlines()[-1] == f"error: {option} {address}: cannot listen there " \
            "(Address already in use)"


def test_shared_coordinators_count_their_own_calls_and_read_the_same_gauges(tmp_path, cli_certs,
                                                                           postgres_url):
    """Two coordinators on one PostgreSQL database (``--shared``), each with ``--metrics``: a study
    and a token created through the first are counted by the first alone, and both expose the
    study in the state gauge, read from the database."""
    ports = [free_port(), free_port()]
    pair = [CoordinatorProcess(tmp_path / name, cli_certs, "--shared", "--metrics", f"127.0.0.1:{port}")
            for name, port in zip("ab", ports, strict=True)]
    try:
        for c in pair:
            c.folder.mkdir()
            c.db, c.token_file = postgres_url, pair[0].token_file  # one database, one operator token
            c.start()
        create_study(pair[0], 2)
        samples = [scrape(port) for port in ports]
        assert [studies(s)["open"] for s in samples] == [1, 1]
        assert [total(s, "fedsketch_rpcs_total", method="Operator/CreateStudy", code="OK")
                for s in samples] == [1, 0]
        assert [total(s, "fedsketch_store_healthy") for s in samples] == [1, 1]
    finally:
        for c in pair:
            if c.proc is not None and c.proc.poll() is None:
                assert c.terminate() == 0
