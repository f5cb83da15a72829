"""The federated round under load, against peers measured in the same run.

1. Ingest: sustained accepted contributions per second into one ``fedsketch coordinator serve``
   process over TLS on loopback (m = 1000 complex sketches, 8 kB each, with Ed25519 signature
   checks, payload checks and a durable SQLite commit per contribution), ``--runs`` (3) times.
   The client pre-signs one contribution per device (``--devices``, 500) and study
   (``--studies``, 4) and keeps ``--inflight`` (32) calls in flight with gRPC futures. Peer: a
   bare gRPC echo server (same TLS, same message bytes, no work), the transport's ceiling here.
2. Growth (``--growth``, instead of 1 and 3): the Submit rate into one study that already holds
   K stored contributions, for each K of ``--stored`` (1000 and 20000): the store is filled
   once per K through the Store API (enrolled devices, a roster of K + ``--window`` + 1, K
   contributions), copied for each of ``--runs`` runs, and fresh coordinators on the copy take
   ``--window`` (2000) more pre-signed contributions; the rate at 20000 over the rate at 1000 is 1
   when a Submit costs O(1) in the stored contributions. Each run also sends the same window
   through the bare TLS echo peer, so the load of the moment shows in the peer too. The store
   (``--db``) is a SQLite file, or a database of a PostgreSQL server the benchmark starts (fsync
   on); on PostgreSQL, each count of ``--coordinators`` (1, 2) is measured in turn: that many
   ``coordinator serve`` processes (``--shared`` when several) on one database, the client's
   channel listing them all (round robin), each process's stored count printed. With
   ``--before EXE`` each run also sends the window into EXE's coordinators (an earlier checkout),
   on a copy of its own; each run prints the coordinators' and the client's CPU a Submit.
3. Scale: ``simulate`` with ``--sim-devices`` (1000) in-process devices sharing
   ``--sim-records`` (N = 10^6, so 10^3 records each) against the same N on 20 devices: the
   study must complete; the ratio is the cost of 50× more devices.

Usage: python benchmarks/bench_round.py [--runs 3] [--devices 500] [--studies 4] [--inflight 32]
    [--sim-devices 1000] [--sim-records 1000000]
       python benchmarks/bench_round.py --growth [--runs 3] [--stored 1000 20000] [--window 2000]
    [--db sqlite|postgres] [--coordinators 1 2] [--before OLD/.venv/bin/fedsketch]
A smoke run: --runs 1 --devices 5 --studies 1 --sim-devices 40 --sim-records 20000
(growth: --growth --runs 1 --stored 10 20 --window 5 [--db postgres --coordinators 1 2]).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from fedsketch.common.net import signing
from fedsketch.common.net.link import Link
from fedsketch.common.net.tls import init_certs, secure_channel, server_credentials
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.common.sketch.frequencies import FrequencySpec
from fedsketch.common.sketch.privacy import PrivacySpec
from fedsketch.common.sketch.spec import SketchSpec
from fedsketch.common.study.study import StudySpec, spec_sha256
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.simulate import run_simulation
from fedsketch.server.store import ContributionRow, open_store

M = 1000
N_PER_DEVICE = 10_000
FEW_DEVICES = 20
#: Rates (per second) of each run, keyed by (stored contributions K, coordinator processes).
Rates = dict[tuple[int, int], list[float]]


def sketch_spec() -> SketchSpec:
    return SketchSpec(FrequencySpec(d=10, m=M, scale=2.0), "complex", 1, PrivacySpec(1.0))


def pairs(rng: np.random.Generator) -> bytes:
    """One valid int64_pairs payload (2m integers well inside the study's bound)."""
    return rng.integers(-10**6, 10**6, 2 * M).astype("<i8").tobytes()


def start_coordinator(folder: Path, db: str | None = None, name: str = "c",
                      shared: bool = False, exe: str | None = None) -> tuple[subprocess.Popen, str, str]:
    """Start ``coordinator serve`` on ``db`` (default: the SQLite file ``folder/c.db``), logging
    to ``folder/<name>.log``; returns the process, its 127.0.0.1:PORT and the operator token."""
    exe = exe or str(Path(sys.executable).with_name("fedsketch"))
    port_file = folder / f"{name}.port"
    port_file.unlink(missing_ok=True)  # a run's second coordinator (``--before``) of this name
    with (folder / f"{name}.log").open("w") as log:
        proc = subprocess.Popen(
            [exe, "coordinator", "serve", "--db", db or str(folder / "c.db"), "--listen", "127.0.0.1:0",
             "--cert", str(folder / "certs/server.pem"), "--key", str(folder / "certs/server.key"),
             "--token-file", str(folder / "op.token"), "--port-file", str(port_file),
             *(["--shared"] if shared else [])],
            stdout=subprocess.DEVNULL, stderr=log)
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"coordinator exited: {(folder / f'{name}.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}", (folder / "op.token").read_text()


def prepare(target: str, ca: Path, token: str, devices: int, studies: int) -> list:
    """Enroll devices, open studies (a roster of all the devices, a far deadline so that none
    closes), register every device, and pre-sign one valid contribution per (device, study)."""
    channel = secure_channel(target, ca)
    op, dev = pb_grpc.OperatorStub(channel), pb_grpc.DeviceStub(channel)
    meta = (("authorization", f"Bearer {token.strip()}"),)
    spec = StudySpec.create("ingest", sketch_spec(), 10, [-15.0] * 10, [15.0] * 10,
                            min_devices=devices, deadline=time.time() + 3600)
    made = [op.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), metadata=meta)
            for _ in range(studies)]
    tokens = op.IssueTokens(pb.IssueTokensRequest(count=devices), metadata=meta).tokens
    rng = np.random.default_rng(0)
    msgs = []
    for tok in tokens:
        key = signing.new_private_key()
        device_id = dev.Enroll(pb.EnrollRequest(token=tok, public_key=signing.public_key(key)),
                               timeout=30).device_id
        for study in made:
            joined = signing.registration_digest(study.study_id, device_id, study.spec_sha256)
            dev.Register(pb.Registration(study_id=study.study_id, device_id=device_id,
                                         spec_sha256=study.spec_sha256,
                                         signature=signing.sign(key, joined)), timeout=30)
            msgs.append(signed(key, study.study_id, device_id, study.spec_sha256, pairs(rng)))
    channel.close()
    return msgs


def signed(key, study_id: str, device_id: str, spec_hash: str, data: bytes) -> pb.Contribution:
    digest = signing.contribution_digest(study_id, device_id, N_PER_DEVICE, spec_hash, data)
    return pb.Contribution(study_id=study_id, device_id=device_id, spec_sha256=spec_hash,
                           n=N_PER_DEVICE, int64_pairs=data, signature=signing.sign(key, digest))


def filled_store(db: str, stored: int, window: int) -> list[pb.Contribution]:
    """A store at ``db`` (a SQLite file or PostgreSQL URL) holding one study whose roster takes
    ``stored + window + 1`` devices (so the window never closes it) with ``stored``
    contributions, written through the Store API (one transaction per call, as the coordinator
    writes them); returns the ``window`` contributions still to send, signed by their enrolled
    devices."""
    spec = StudySpec.create("growth", sketch_spec(), 10, [-15.0] * 10, [15.0] * 10, min_devices=2,
                            roster=stored + window + 1, deadline=time.time() + 86400)
    text = spec.to_json()
    study, spec_hash = "st-growth", spec_sha256(text)
    store = open_store(db)
    rng = np.random.default_rng(0)
    try:
        store.create_study(study, text, spec_hash, spec.deadline, spec.min_devices, roster=spec.roster)
        store.add_tokens([f"tok-{i}" for i in range(stored + window)])
        devices = []
        for i in range(stored + window):
            key = signing.new_private_key()
            devices.append((key, store.enroll(f"tok-{i}", signing.public_key(key), f"device {i}")))
            store.register(study, devices[-1][1])
        for key, device in devices[:stored]:
            data = pairs(rng)
            sig = signing.sign(key, signing.contribution_digest(study, device, N_PER_DEVICE, spec_hash, data))
            store.add_contribution(ContributionRow(study, device, float(N_PER_DEVICE), "int64_pairs", data,
                                                   hashlib.sha256(data).hexdigest(), sig, time.time()))
        msgs = [signed(key, study, device, spec_hash, pairs(rng)) for key, device in devices[stored:]]
    finally:
        store.close()
    return msgs


class SQLiteFiles:
    """The growth runs' stores as SQLite files in ``base``: filled once per K, copied per run."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def empty(self, k: int) -> str:
        """Where the store of K stored contributions is filled."""
        return str(self.base / f"filled-{k}.db")

    def settle(self, k: int) -> None:
        """Nothing: SQLite does no work of its own between commits."""

    def copy(self, k: int, folder: Path) -> str:
        """A copy of the filled store of K, for one run in ``folder``, on disk before it returns
        (else the kernel writes the copy back during the timed window, a cost growing with K)."""
        shutil.copy(self.empty(k), folder / "c.db")
        with (folder / "c.db").open("rb+") as copy:
            os.fsync(copy.fileno())
        return str(folder / "c.db")

    def drop(self, db: str) -> None:
        """Nothing: the copy goes with its run's folder."""

    def stop(self) -> None:
        """Nothing to stop."""


class PostgresDatabases:
    """The growth runs' stores as databases of a PostgreSQL server this process starts (the
    tests' :class:`pgtest.TestServer`, with fsync on: a commit returns once its WAL is on disk,
    like SQLite's synchronous=FULL). The database of K is filled with ``synchronous_commit=off``
    (a per-database setting, which a copy does not inherit) and copied per run with
    ``CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY``, which checkpoints: the copy is on disk
    before its coordinator starts. Each filled database is vacuumed and analyzed once, so that
    no run's copy starts with autovacuum's work on the fill still to do."""

    def __init__(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from pgtest import TestServer

        self.server = TestServer(fsync=True)
        self.runs = 0

    def empty(self, k: int) -> str:
        self.server.execute(f"CREATE DATABASE filled_{k}")
        self.server.execute(f"ALTER DATABASE filled_{k} SET synchronous_commit = off")
        return self.server.url(f"filled_{k}")

    def settle(self, k: int) -> None:
        import psycopg  # the postgres extra, as the store itself

        with psycopg.connect(self.server.url(f"filled_{k}"), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")

    def copy(self, k: int, folder: Path) -> str:
        self.runs += 1
        self.server.execute(f"CREATE DATABASE run_{self.runs} TEMPLATE filled_{k} STRATEGY FILE_COPY")
        return self.server.url(f"run_{self.runs}")

    def drop(self, db: str) -> None:
        self.server.drop_database(db.rpartition("/")[2].partition("?")[0])

    def stop(self) -> None:
        self.server.stop()


def submit_window(folder: Path, db: str, coordinators: int, msgs: list, inflight: int,
                  exe: str | None = None) -> tuple[float, list]:
    """Contributions/s of ``msgs`` into ``coordinators`` fresh ``coordinator serve`` processes on
    ``db`` (``--shared`` when more than one; the client's channel lists them all, round robin),
    and how many each process stored (its log's ``event=contribute`` lines)."""
    procs, targets = [], []
    try:
        for i in range(coordinators):  # one at a time: the first writes the operator token
            proc, target, _ = start_coordinator(folder, db, f"c{i}", shared=coordinators > 1, exe=exe)
            procs.append(proc)
            targets.append(target)
        channel = Link(",".join(targets), folder / "certs/ca.pem", False).channel()
        cpu, own = [cpu_seconds(p.pid) for p in procs], time.process_time()
        rate = blast(pb_grpc.DeviceStub(channel).Submit, msgs, inflight)
        cpu = [cpu_seconds(p.pid) - c for p, c in zip(procs, cpu, strict=True)]
        print(f"  CPU ms a Submit: coordinators {1000 * sum(cpu) / len(msgs):.2f}, client "
              f"{1000 * (time.process_time() - own) / len(msgs):.2f}", flush=True)
        channel.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    return rate, [(folder / f"c{i}.log").read_text().count("event=contribute") for i in range(coordinators)]


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def growth(runs: int, sizes: list[int], window: int, inflight: int, db: str,
           coordinators: list[int], before: str | None = None) -> tuple[Rates, Rates, Rates]:
    """Submit rates (contributions/s) of ``window`` contributions into a study already holding
    K contributions, for each K in ``sizes`` and number of coordinator processes in
    ``coordinators``, in turn, ``runs`` times each on a fresh copy of its store (``db``: "sqlite"
    files or "postgres" databases); and the bare echo's rate for the same messages right after
    each run. Both keyed by (K, processes)."""
    cases = [(k, n) for k in sizes for n in coordinators]
    rates: Rates = {case: [] for case in cases}
    echoes: Rates = {case: [] for case in cases}
    earlier: Rates = {case: [] for case in cases}  # with ``before``'s coordinators
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        init_certs(base / "certs", ["localhost", "127.0.0.1"])
        stores = SQLiteFiles(base) if db == "sqlite" else PostgresDatabases()
        try:
            msgs: dict[int, list[pb.Contribution]] = {}
            for k in sizes:
                t = time.perf_counter()
                msgs[k] = filled_store(stores.empty(k), k, window)
                stores.settle(k)
                print(f"filled {k} contributions in {time.perf_counter() - t:.0f} s", flush=True)
            for run in range(runs):  # the cases take turns, so a change in the machine's load hits all
                for k, n in cases:
                    folder = base / f"run-{k}-{n}-{run}"
                    folder.mkdir()
                    shutil.copytree(base / "certs", folder / "certs")
                    copy = stores.copy(k, folder)
                    try:
                        rate, took = submit_window(folder, copy, n, msgs[k], inflight)
                    finally:
                        stores.drop(copy)
                    rates[k, n].append(rate)
                    echoes[k, n].append(echo_rate(folder, msgs[k], inflight))
                    if before:  # the same window into an earlier release, on a copy of its own
                        copy = stores.copy(k, folder)
                        try:
                            earlier[k, n].append(submit_window(folder, copy, n, msgs[k], inflight,
                                                               before)[0])
                        finally:
                            stores.drop(copy)
                        print(f"run {run}: the same into {before}: {earlier[k, n][-1]:.0f}/s", flush=True)
                    shutil.rmtree(folder)
                    print(f"run {run}: {window} Submits after {k} stored, {n} {db} coordinator(s): "
                          f"{rate:.0f}/s, stored by each {took} (echo {echoes[k, n][-1]:.0f}/s)", flush=True)
        finally:
            stores.stop()
    return rates, echoes, earlier


def blast(call, msgs: list, inflight: int) -> float:
    """Messages per second with ``inflight`` concurrent unary calls (every reply checked)."""
    t = time.perf_counter()
    pending = []
    for msg in msgs:
        pending.append(call.future(msg, timeout=120))
        if len(pending) >= inflight:
            pending.pop(0).result()
    for f in pending:
        f.result()
    return len(msgs) / (time.perf_counter() - t)


def echo_rate(folder: Path, msgs: list, inflight: int) -> float:
    """The same bytes through a do-nothing TLS gRPC server (the transport ceiling)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"")
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "bench.Echo", {"Put": handler})])
    port = server.add_secure_port("127.0.0.1:0", server_credentials(
        folder / "certs/server.pem", folder / "certs/server.key"))
    server.start()
    channel = secure_channel(f"localhost:{port}", folder / "certs/ca.pem")
    call = channel.unary_unary("/bench.Echo/Put", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    try:
        own = time.process_time()
        rate = blast(call, msgs, inflight)
        print(f"  CPU ms a message through the echo (client and server): "
              f"{1000 * (time.process_time() - own) / len(msgs):.2f}", flush=True)
        return rate
    finally:
        channel.close()
        server.stop(None)


def ingest(runs: int, devices: int, studies: int, inflight: int) -> tuple[list, list]:
    ours, peer = [], []
    for run in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            init_certs(folder / "certs", ["localhost", "127.0.0.1"])
            proc, target, token = start_coordinator(folder)
            try:
                msgs = prepare(target, folder / "certs/ca.pem", token, devices, studies)
                channel = secure_channel(target, folder / "certs/ca.pem")
                ours.append(blast(pb_grpc.DeviceStub(channel).Submit, msgs, inflight))
                channel.close()
            finally:
                proc.terminate()
                proc.wait()
            peer.append(echo_rate(folder, msgs, inflight))
        print(f"run {run}: {len(msgs)} contributions, coordinator {ours[-1]:.0f}/s, "
              f"echo {peer[-1]:.0f}/s", flush=True)
    return ours, peer


def timed_simulation(devices: int, records: int) -> tuple[float, dict]:
    """Wall seconds and report of one in-process ``simulate`` study at ε = 1."""
    t = time.perf_counter()
    report = run_simulation(SimConfig(devices=devices, records=records, epsilon=1.0))
    return time.perf_counter() - t, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3,
                    help="ingest runs, each on a fresh coordinator (default: %(default)s)")
    ap.add_argument("--devices", type=int, default=500,
                    help="devices enrolled for the ingest (default: %(default)s)")
    ap.add_argument("--studies", type=int, default=4,
                    help="studies each ingest device contributes to (default: %(default)s)")
    ap.add_argument("--inflight", type=int, default=32,
                    help="concurrent calls during the ingest (default: %(default)s)")
    ap.add_argument("--sim-devices", type=int, default=1000,
                    help=f"devices of the big simulation, against {FEW_DEVICES} (default: %(default)s)")
    ap.add_argument("--sim-records", type=int, default=1_000_000,
                    help="records N of both simulations, split over their devices (default: %(default)s)")
    ap.add_argument("--growth", action="store_true",
                    help="measure only the Submit rate against the stored contributions (item 2)")
    ap.add_argument("--stored", type=int, nargs="+", default=[1000, 20000],
                    help="contributions a study holds before the measured window (default: %(default)s)")
    ap.add_argument("--window", type=int, default=2000,
                    help="contributions sent and timed after them (default: %(default)s)")
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite",
                    help="growth: the coordinators' store, SQLite files or a PostgreSQL server started "
                    "here (default: %(default)s)")
    ap.add_argument("--before", metavar="EXE",
                    help="growth: also send each run's window into coordinators of this `fedsketch` "
                    "executable (an earlier checkout's), on a copy of its own, right after")
    ap.add_argument("--coordinators", type=int, nargs="+", default=[1],
                    help="growth: coordinator processes sharing the PostgreSQL database, each count "
                    "measured in turn (default: %(default)s)")
    args = ap.parse_args()
    if args.growth:
        if args.db == "sqlite" and args.coordinators != [1]:
            ap.error("several coordinators share a PostgreSQL database only: add --db postgres")
        rates, echoes, earlier = growth(args.runs, args.stored, args.window, args.inflight, args.db,
                                        args.coordinators, args.before)
        then = " | before: Submits/s (median; runs) | now / before" if args.before else ""
        print(f"\n| stored contributions | {args.db} coordinator processes | Submits/s (median of "
              f"{args.runs}; runs) | against {args.stored[0]} | bare TLS echo/s (median) | Submits / echo"
              f"{then} |\n|---|---|---|---|---|---|{'---|---|' if then else ''}")
        for (k, n), r in rates.items():
            o, p = statistics.median(r), statistics.median(echoes[k, n])
            first = statistics.median(rates[args.stored[0], n])
            line = (f"| {k} | {n} | {o:.0f} ({', '.join(f'{x:.0f}' for x in r)}) | {o / first:.2f} | "
                    f"{p:.0f} | {o / p:.2f} |")
            if args.before:
                b = statistics.median(earlier[k, n])
                line += f" {b:.0f} ({', '.join(f'{x:.0f}' for x in earlier[k, n])}) | {o / b:.2f} |"
            print(line)
        return
    ours, peer = ingest(args.runs, args.devices, args.studies, args.inflight)
    t_many, many = timed_simulation(args.sim_devices, args.sim_records)
    t_few, few = timed_simulation(FEW_DEVICES, args.sim_records)
    o, p = statistics.median(ours), statistics.median(peer)
    print("\n| round | fedsketch | peer | ratio |\n|---|---|---|---|")
    print(f"| accepted contributions/s, m = {M}, TLS, signed, durable (median of {args.runs}) | "
          f"{o:.0f} | bare TLS gRPC echo {p:.0f} | {o / p:.2f} |")
    print(f"| simulate: {args.sim_devices} devices x {args.sim_records // args.sim_devices:,} records, "
          f"wall s | {t_many:.1f} (devices {many['seconds']['devices']:.1f}, relative SSE "
          f"{many['relative_sse']:.3f}) | {FEW_DEVICES} devices x {args.sim_records // FEW_DEVICES:,}: "
          f"{t_few:.1f} (relative SSE {few['relative_sse']:.3f}) | {t_many / t_few:.1f}x |")


if __name__ == "__main__":
    main()
