"""Memory of a gRPC server fed garbage: RSS growth per 1,000 unparseable requests to Device/Submit.

Each run starts a fresh server process, sends ``--warmup`` (1,000) garbage requests so that its
allocator settles, reads VmRSS from /proc/<pid>/status, sends ``--requests`` (5,000) more random
200-byte bodies over one plaintext loopback channel, reads VmRSS again, and stops the server. It
reports the median over ``--runs`` (3) of (after − before) per 1,000 requests, for three servers
measured in the same run:

- ``fedsketch coordinator serve`` (--insecure): our bytes handlers parse inside the handler;
- a bare grpcio server registering a trivial servicer with the generated
  ``add_DeviceServicer_to_server`` (grpcio parses with ``Contribution.FromString`` as its request
  deserializer), the path the coordinator used before;
- the same bare server with ``request_deserializer=None`` and ``FromString`` inside the handler.

Usage: python benchmarks/bench_garbage.py [--runs 3] [--requests 5000] [--warmup 1000]
A smoke run: --runs 1 --requests 200 --warmup 50.
(``python benchmarks/bench_garbage.py serve-peer PORT_FILE generated|bytes`` runs one peer.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.pb import fedsketch_pb2_grpc as pb_grpc

BODY_BYTES = 200
SUBMIT = "/fedsketch.v1.Device/Submit"


class _Servicer(pb_grpc.DeviceServicer):
    def Submit(self, request, context):  # noqa: N802 (gRPC method names)
        return pb.SubmitReply()


def _parse_in_handler(raw: bytes, context: grpc.ServicerContext) -> pb.SubmitReply:
    try:
        pb.Contribution.FromString(raw)
    except DecodeError:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a Contribution")
    return pb.SubmitReply()


def serve_peer(port_file: Path, how: str) -> None:
    """A bare grpcio server with Device/Submit only (``generated``: the generated registration;
    ``bytes``: bytes in, parsed in the handler) until killed."""
    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    if how == "generated":
        pb_grpc.add_DeviceServicer_to_server(_Servicer(), server)
    else:
        handler = grpc.unary_unary_rpc_method_handler(
            _parse_in_handler, request_deserializer=None,
            response_serializer=pb.SubmitReply.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("fedsketch.v1.Device", {"Submit": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_file.write_text(f"{port}\n")
    threading.Event().wait()


def start(kind: str, folder: Path) -> tuple[subprocess.Popen, str]:
    """A server process of ``kind`` (coordinator, generated, bytes) and its address."""
    port_file = folder / f"{kind}.port"
    if kind == "coordinator":
        exe = str(Path(sys.executable).with_name("fedsketch"))
        cmd = [exe, "coordinator", "serve", "--db", str(folder / "c.db"), "--listen", "127.0.0.1:0",
               "--insecure", "--token-file", str(folder / "op.token"), "--port-file", str(port_file)]
    else:
        cmd = [sys.executable, __file__, "serve-peer", str(port_file), kind]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"the {kind} server exited with status {proc.returncode}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


def rss_kib(pid: int) -> int:
    """VmRSS of a process (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def send_garbage(call, count: int) -> dict[str, int]:
    """``count`` random bodies; how many replies got each status."""
    codes: dict[str, int] = {}
    for _ in range(count):
        try:
            call(os.urandom(BODY_BYTES), timeout=30)
            name = "OK"
        except grpc.RpcError as exc:
            name = exc.code().name
        codes[name] = codes.get(name, 0) + 1
    return codes


def measure(kind: str, requests: int, warmup: int) -> tuple[float, dict[str, int]]:
    """RSS growth (KiB) per 1,000 garbage requests to a fresh server, and the replies' statuses."""
    with tempfile.TemporaryDirectory() as tmp:
        proc, target = start(kind, Path(tmp))
        try:
            with grpc.insecure_channel(target) as channel:
                call = channel.unary_unary(SUBMIT)
                send_garbage(call, warmup)
                time.sleep(0.5)
                before = rss_kib(proc.pid)
                codes = send_garbage(call, requests)
                time.sleep(0.5)
                after = rss_kib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return (after - before) * 1000 / requests, codes


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "serve-peer":
        serve_peer(Path(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=1000)
    args = ap.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    print(f"CPU: {cpu}; {args.runs} runs of {args.requests} random {BODY_BYTES}-byte bodies to "
          f"Device/Submit after {args.warmup} warm-up ones")
    rows = {"coordinator": "fedsketch coordinator serve (bytes handlers)",
            "generated": "bare grpcio, generated servicer (deserializer FromString)",
            "bytes": "bare grpcio, bytes in, FromString in the handler"}
    growth: dict[str, list[float]] = {k: [] for k in rows}
    replies: dict[str, dict[str, int]] = {}
    for _ in range(args.runs):
        for kind in rows:  # interleaved, so that load on the machine falls on all three alike
            per_1000, replies[kind] = measure(kind, args.requests, args.warmup)
            growth[kind].append(per_1000)
    print("| server | RSS growth per 1,000 garbage requests (KiB), median | min | max | replies (last run) |")
    print("|---|---|---|---|---|")
    for kind, label in rows.items():
        g = growth[kind]
        codes = ", ".join(f"{name} {n}" for name, n in sorted(replies[kind].items()))
        print(f"| {label} | {statistics.median(g):.0f} | {min(g):.0f} | {max(g):.0f} | {codes} |")


if __name__ == "__main__":
    main()
