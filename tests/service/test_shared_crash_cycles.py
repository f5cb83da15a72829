"""Crash cycles on three ``fedsketch coordinator serve --shared`` processes over one PostgreSQL
database (the tests' own server), with twenty ``fedsketch device run`` daemons listing all three
(round robin, TLS on loopback): waves of three studies whose rosters take every device (two
plain, one with a refinement round), each wave created once the last one ended, while a killer
SIGKILLs a random coordinator every second or so and restarts it on its port. Afterwards, from
the database and the devices' ledgers: every contribution a device recorded as acknowledged is
stored, byte for byte (zero lost); no device spent twice on one study; each study and round
moved to ``decoding`` once and to ``done`` once, from every device, and published one result,
which the serve logs announce once."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_round_processes import FEDSKETCH, CoordinatorProcess

from fedsketch.client.ledger import Ledger
from fedsketch.common.data.synthetic import gmm
from fedsketch.common.study.study import StudySpec
from fedsketch.server.store import open_store

pytestmark = pytest.mark.slow

#: Devices, each its own ``device run`` process, ledger and data file of RECORDS records.
DEVICES = 20
RECORDS = 500
#: Waves of three studies, each created once the previous wave ended (a longer run:
#: ``FEDSKETCH_CRASH_WAVES=12 pytest -s tests/service/test_shared_crash_cycles.py``).
WAVES = int(os.environ.get("FEDSKETCH_CRASH_WAVES", "4"))
#: Seconds from a restart to the next kill (uniform), and the most the whole test may take (a
#: wave takes 5 to 10 s on a loaded 2-core machine).
KILL_EVERY = (0.3, 1.0)
DEADLINE_SECONDS = 120 + 30 * WAVES
#: Each device's ε: every study costs 5, so none is declined for its budget.
BUDGET = 6 * 3 * WAVES


def start_device(i: int, data: Path, ledger: Path, token: str, targets: str, certs: Path,
                 log: Path) -> subprocess.Popen:
    """A ``device run`` daemon polling fast (0.3 s, backing off to 1 s at most while it fails)."""
    return subprocess.Popen(
        [FEDSKETCH, "device", "run", "--coordinator", targets, "--ca", str(certs / "ca.pem"),
         "--data", str(data), "--ledger", str(ledger), "--budget", str(BUDGET), "--token", token,
         "--label", f"d{i}", "--poll", "0.3", "--max-poll", "1"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)


class Killer(threading.Thread):
    """SIGKILLs a random coordinator of ``trio`` every KILL_EVERY seconds and restarts it on its
    port (the next kill after it serves again); counts its ``kills`` and measures each restart
    (``restarts``, seconds until it serves)."""

    def __init__(self, trio: list[CoordinatorProcess]) -> None:
        super().__init__(name="killer", daemon=True)
        self.trio, self.kills, self.restarts = trio, 0, []
        self._stop_event, self._rng = threading.Event(), random.Random(5)

    def run(self) -> None:
        while not self._stop_event.wait(self._rng.uniform(*KILL_EVERY)):
            victim = self._rng.choice(self.trio)
            victim.kill()
            self.kills += 1
            begun = time.monotonic()
            victim.start()  # same database, same port
            self.restarts.append(time.monotonic() - begun)

    def stop(self) -> None:
        """Stop after the cycle under way (every coordinator serves again)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=120)


def create(trio: list[CoordinatorProcess], name: str, rounds: int) -> str:
    """A study whose quorum is 16 and roster all twenty devices (so it closes once every device
    sent: a study left behind shows as one that never ends, not as a shorter one), created
    through a random coordinator, the next one if that one is down (the killer does not wait:
    a study made by a call that failed is still found in the database at the end)."""
    for c in random.sample(trio, len(trio)) * 10:
        res = c.op("create-study", "--name", name, "--d", "3", "--k", "3", "--bounds", "-12:12",
                   "--scale", "1.5", "--epsilon", "5", "--m", "60", "--r", "60", "--replicates", "2",
                   "--min-devices", "16", "--roster", str(DEVICES), "--rounds", str(rounds), check=False)
        if res.returncode == 0:
            return res.stdout.strip()
        time.sleep(0.2)
    raise AssertionError(res.stderr)


def stop(devices: list[subprocess.Popen], coordinators: list[subprocess.Popen]) -> list[int]:
    """SIGTERM every process, SIGKILL any still running a minute later (none outlives the test);
    the devices' exit codes."""
    everyone = devices + coordinators
    for proc in everyone:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes = []
    for proc in everyone:
        try:
            codes.append(proc.wait(timeout=60))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes[:len(devices)]


def test_sigkilled_shared_coordinators_lose_no_ack_and_decode_each_study_once(tmp_path, postgres_url,
                                                                              cli_certs):
    certs = cli_certs
    trio = [CoordinatorProcess(tmp_path / name, certs, "--shared") for name in "abc"]
    ledgers = [tmp_path / f"ledger{i}" for i in range(DEVICES)]
    devices: list[subprocess.Popen] = []
    killer = Killer(trio)
    try:
        for c in trio:
            c.folder.mkdir()
            c.db, c.token_file = postgres_url, trio[0].token_file
            c.start()
        targets = ",".join(f"127.0.0.1:{c.port}" for c in trio)
        tokens = trio[0].op("tokens", "--count", str(DEVICES)).stdout.split()
        x, _, _ = gmm(DEVICES * RECORDS, 3, 3, 3.0, seed=12)
        started = time.monotonic()
        for i, part in enumerate(np.array_split(x, DEVICES)):
            np.save(tmp_path / f"x{i}.npy", part)
            devices.append(start_device(i, tmp_path / f"x{i}.npy", ledgers[i], tokens[i], targets, certs,
                                        tmp_path / f"device{i}.log"))
        killer.start()
        store = open_store(postgres_url)
        try:
            for wave in range(WAVES):  # the next wave once the last one ended, kills all along
                for name, rounds in ((f"p{wave}", 0), (f"q{wave}", 0), (f"r{wave}", 1)):
                    create(trio, name, rounds)  # two plain studies and one with a refinement round
                while any(r.state not in ("done", "failed") for r in store.list_studies()):
                    assert time.monotonic() - started < DEADLINE_SECONDS, [
                        (r.study_id, r.state, r.detail, r.registered, r.contributions)
                        for r in store.list_studies() if r.state not in ("done", "failed")]
                    time.sleep(0.2)
        finally:
            store.close()
    finally:
        killer.stop()
        codes = stop(devices, [c.proc for c in trio if c.proc is not None])
    elapsed = time.monotonic() - started
    assert codes == [0] * DEVICES

    store = open_store(postgres_url)
    try:
        rows = store.list_studies()  # with any a failed create-study call made
        stored = {(r.study_id, r.device_id): r.payload
                  for row in rows for r in store.contributions(row.study_id)}
        audit = [e[3] for e in store.audit_log(100_000) if e[2] in ("set_state", "put_result")]
        results = {row.study_id: store.get_result(row.study_id) for row in rows}
    finally:
        store.close()
    acked, spent = 0, {}
    for path in ledgers:
        book = Ledger(path)
        try:
            device_id, spends = book.identity().device_id, book.spends()
        finally:
            book.close()
        ids = [spend.study_id for spend in spends]
        assert len(ids) == len(set(ids)), ids  # no device spent twice on one study
        for spend in spends:
            spent[spend.study_id, device_id] = spend.payload
            if spend.acked_at is not None:  # zero lost: each acknowledged one is stored as sent
                acked += 1
                found = stored.get((spend.study_id, device_id))
                assert found == spend.payload, f"acknowledged, not stored: {path.name}, {spend.study_id}"
    # and nothing stored that its device did not record (stored, its ack lost in a kill, and the
    # device stopped before it re-sent: recorded, not yet acknowledged)
    assert {key: spent.get(key) for key in stored} == stored
    for row in rows:  # every study and round: done, by one decode, from every device
        assert (row.state, row.contributions) == ("done", DEVICES), row
        moves = [d for d in audit if f"study {row.study_id!r}" in d]
        assert len([d for d in moves if re.search(r"(open|collecting) -> decoding", d)]) == 1, moves
        assert [d for d in moves if "-> done" in d] == [f"study {row.study_id!r}: decoding -> done"], moves
        assert results[row.study_id] is not None
    logs = "".join(c.log.read_text() for c in trio)
    studies = [row for row in rows if row.parent is None]
    for row in studies:  # the serve logs announce each decode once
        refined = StudySpec.from_json(row.spec_json).refine is not None
        said = [rf"study {row.study_id}: round 1 decoded from {DEVICES} devices",
                rf"study {row.study_id} published after 1 refinement rounds"] if refined else [
                rf"study {row.study_id} decoded from {DEVICES} devices"]
        assert [len(re.findall(line, logs)) for line in said] == [1] * len(said), (row, said)
    assert len(studies) >= 3 * WAVES and len(rows) == len(studies) + WAVES  # one round per r-study

    assert killer.kills >= 2 * WAVES
    print(f"crash cycles: {killer.kills} kills of 3 shared coordinators in {elapsed:.0f} s (restarts "
          f"{np.median(killer.restarts):.1f} s median, {max(killer.restarts):.1f} s max), {DEVICES} devices, "
          f"{len(rows)} studies and rounds done once each, {acked} acknowledged contributions (of "
          f"{len(stored)} stored), none lost")
