"""The simulator's helper (``simulate --validation helper``): a `fedsketch helper serve` process
with its own TLS identity (a CA and certificate of its own, made by the coordinator's tooling),
its own SQLite file and token file, started the way an operator starts it, and the study spec
naming it (docs/bounded-influence.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from fedsketch.common.net.tls import init_certs
from fedsketch.common.study.study import StudySpec

#: Seconds the helper may take to start (a Python process on a loaded machine: generous).
START_SECONDS = 120.0


@dataclass(frozen=True)
class SimHelper:
    """A running helper: its address, its CA certificate's PEM, the coordinator's token and its
    process id."""

    target: str
    ca_pem: str
    token: str
    pid: int

    def name_in(self, spec: StudySpec) -> StudySpec:
        """``spec`` validated by this helper."""
        sa = replace(spec.secure_aggregation, validation="helper", helper=self.target,
                     helper_ca=self.ca_pem)
        return replace(spec, secure_aggregation=sa)


def start_helper(stack: ExitStack, folder: Path) -> SimHelper:
    """Start the helper process in ``folder`` (``stack`` stops it); RuntimeError if it does not
    start."""
    folder.mkdir(parents=True, exist_ok=True)
    certs = init_certs(folder / "certs", ["localhost", "127.0.0.1"])
    port_file, log = folder / "port", (folder / "helper.log").open("w")
    stack.callback(log.close)
    exe = str(Path(sys.executable).with_name("fedsketch"))
    proc = subprocess.Popen(
        [exe, "helper", "serve", "--db", str(folder / "helper.db"), "--listen", "127.0.0.1:0",
         "--cert", str(certs.server_cert), "--key", str(certs.server_key),
         "--token-file", str(folder / "helper.token"), "--port-file", str(port_file)],
        stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)
    deadline = time.monotonic() + START_SECONDS
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the helper did not start: {(folder / 'helper.log').read_text()}")
        time.sleep(0.05)
    return SimHelper(f"localhost:{port_file.read_text().strip()}", certs.ca_cert.read_text(),
                     (folder / "helper.token").read_text().strip(), proc.pid)


def validation_report(rnd, agents: list) -> dict:
    """What the verification did, for the report: ``report`` (None unless the study was
    validated) counts the valid reports and lists the excluded devices by index (of
    ``agents``, in-process devices; by device id otherwise), and ``excluded`` maps each
    excluded device's index to the reason, for the hostile section."""
    outcome = getattr(rnd, "validation", None)
    if outcome is None:
        return {"report": None, "excluded": {}}
    index = {a.ledger.identity().device_id: i for i, a in enumerate(agents)}
    excluded = [index.get(device, device) for device in outcome["excluded"]]
    why = "its report was excluded: its range proof failed (or it sent none that verified)"
    return {"report": {"valid": len(outcome["valid"]), "excluded": excluded},
            "excluded": {i: [why] for i in excluded if isinstance(i, int)}}
