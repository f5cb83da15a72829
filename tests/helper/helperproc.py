"""A `fedsketch helper serve` process for the tests: its own TLS identity (a CA and
certificate of its own, `fedsketch certs`' tooling), its SQLite file and its token file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from fedsketch.common.net.tls import init_certs, secure_channel
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc
from fedsketch.server.helper.link import helper_stub

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))


class Helper:
    """A `fedsketch helper serve` process on a free loopback port."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        if not (folder / "certs" / "ca.pem").exists():
            init_certs(folder / "certs", ["localhost", "127.0.0.1"])
        self.start()

    def start(self) -> None:
        port_file = self.folder / "port"
        port_file.unlink(missing_ok=True)
        certs = self.folder / "certs"
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                [FEDSKETCH, "helper", "serve", "--db", str(self.folder / "helper.db"),
                 "--listen", "127.0.0.1:0", "--cert", str(certs / "server.pem"), "--key",
                 str(certs / "server.key"), "--token-file", str(self.folder / "helper.token"),
                 "--port-file", str(port_file)], stderr=log)
        deadline = time.monotonic() + 120  # generous: a loaded machine starts Python slowly
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the helper did not start: {self.log.read_text()}")
            time.sleep(0.05)
        self.target = f"localhost:{port_file.read_text().strip()}"

    @property
    def log(self) -> Path:
        """Its stderr, every start's appended: a file, not a pipe nobody reads, which blocks the
        helper once 64 KiB of log lines fill it (it then cannot even exit on SIGTERM)."""
        return self.folder / "helper.log"

    @property
    def ca(self) -> Path:
        return self.folder / "certs" / "ca.pem"

    def device(self) -> pb_grpc.HelperStub:
        return pb_grpc.HelperStub(secure_channel(self.target, self.ca))

    def coordinator(self):
        return helper_stub(self.target, self.ca.read_bytes(),
                           (self.folder / "helper.token").read_text().strip())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)  # its gRPC grace is 5 s
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("the helper did not stop within 30 s of SIGTERM; its log:\n"
                                     + self.log.read_text()) from None
