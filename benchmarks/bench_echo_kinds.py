"""The bare TLS gRPC echo as each kind of Python server, in a process of its own: threaded
(``grpc.server`` with a pool of 16, what ``coordinator serve`` runs) against ``grpc.aio`` (one
event loop), the same m = 1000 contributions (8 kB) from a client in this process with 32 calls
in flight. Prints each kind's messages/s and its server's CPU ms a message, ``--runs`` times
taking turns: what switching the coordinator's Device service to ``grpc.aio`` could save at
most in the transport (RESULTS.md §22).

Usage: python benchmarks/bench_echo_kinds.py [--runs 5] [--messages 2000]
       python benchmarks/bench_echo_kinds.py --serve KIND CERTS PORTFILE   (the server process)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
from bench_round import blast, cpu_seconds

from fedsketch.common.net.tls import init_certs, secure_channel, server_credentials
from fedsketch.common.pb import fedsketch_pb2 as pb

KINDS = ("threaded", "aio")


def serve(kind: str, certs: Path, port_file: Path) -> None:
    """Serve /bench.Echo/Put (every request answered with empty bytes) until killed."""
    creds = server_credentials(certs / "server.pem", certs / "server.key")
    if kind == "threaded":
        server = grpc.server(ThreadPoolExecutor(max_workers=16))
        handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "bench.Echo", {"Put": handler})])
        port_file.write_text(str(server.add_secure_port("127.0.0.1:0", creds)))
        server.start()
        server.wait_for_termination()
        return

    async def put(req, ctx):
        return b""

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(put)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "bench.Echo", {"Put": handler})])
        port_file.write_text(str(server.add_secure_port("127.0.0.1:0", creds)))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def one(kind: str, folder: Path, msgs: list) -> tuple[float, float]:
    """(messages/s, server CPU ms a message) of one kind's echo process."""
    port_file = folder / f"{kind}.port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, str(folder / "certs"),
                             str(port_file)])
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        channel = secure_channel(f"localhost:{port_file.read_text()}", folder / "certs/ca.pem")
        call = channel.unary_unary("/bench.Echo/Put", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=lambda b: b)
        blast(call, msgs[:200], 32)  # warm
        cpu = cpu_seconds(proc.pid)
        rate = blast(call, msgs, 32)
        cpu = cpu_seconds(proc.pid) - cpu
        channel.close()
        return rate, 1000 * cpu / len(msgs)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--serve", nargs=3, metavar=("KIND", "CERTS", "PORTFILE"))
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], Path(args.serve[1]), Path(args.serve[2]))
        return
    rng = np.random.default_rng(0)
    msgs = [pb.Contribution(study_id="st-x", device_id=f"dev-{i}", spec_sha256="0" * 64, n=1e4,
                            int64_pairs=rng.integers(-10**6, 10**6, 2000).astype("<i8").tobytes(),
                            signature=bytes(64)) for i in range(args.messages)]
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        init_certs(folder / "certs", ["localhost", "127.0.0.1"])
        for run in range(args.runs):
            for kind in KINDS:
                results[kind].append(one(kind, folder, msgs))
                print(f"run {run}: {kind} echo {results[kind][-1][0]:.0f}/s, server CPU ms a message "
                      f"{results[kind][-1][1]:.3f}", flush=True)
    print("\n| echo server | messages/s, median (runs) | server CPU ms a message, median (runs) |")
    print("|---|---|---|")
    for kind in KINDS:
        rates, cpus = zip(*results[kind], strict=True)
        print(f"| {kind} | {statistics.median(rates):.0f} ({', '.join(f'{r:.0f}' for r in rates)}) | "
              f"{statistics.median(cpus):.3f} ({', '.join(f'{c:.3f}' for c in cpus)}) |")


if __name__ == "__main__":
    main()
