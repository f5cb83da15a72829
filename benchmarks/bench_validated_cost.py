"""What a validated secure study costs against today's SecAgg+ (issue 32, must-show 2).

For each L of ``--devices`` (100 and 1000), two secure rounds of the same study, one after the
other in this one run: SecAgg+ as it is (the sparse graph of degree ⌈3·log2 L⌉, no stated
dropouts or colluders: six stages), and the same study validated by a helper
(``validation: "helper"``, design (a) of docs/bounded-influence.md: REGISTER, then one report
per device, its input shared between the coordinator and a ``fedsketch helper serve`` process
with R = 3 fully linear proofs of range; no masks). Paper 004's mixture (d = k = 10), 10³ records
per device (iid), m = ``--m`` (1000), the quantized map, r = 1, ε = 1; in-process devices over
TLS on loopback, stepped in turn (what ``fedsketch simulate`` runs), a real helper process.

Measured, all with BLAS held to one thread (``threadpoolctl``) so that CPU seconds do not depend
on the other core:

* per device: its own thread's CPU seconds over the round (:func:`time.thread_time` around each
  of its steps: reading and sketching its records, noise share, then either keys, masks,
  Shamir shares and signatures, or the proof and the shares), median and largest over devices;
  bytes it sends (its round messages, with the helper's share: ``Agent.bytes_sent``) and the
  bytes the coordinator routes to it (``Agent.bytes_received``), medians;
* the coordinator, per stage: CPU seconds of its threads inside the round
  (``SecAggRound.stage_cpu``, server/service/stage_clock.py: the stage's messages parsed and
  stored, fetches answered, and the stage's closing), the wall seconds the stage stayed open
  (``stage_open``: the devices' turn, stepped one after another) and the wall seconds its
  closing took (``stage_seconds``; at a validated MASKED_INPUT this includes waiting for the
  helper); and the process's other CPU (gRPC on both sides, TLS, signature checks at the edge,
  the driver): the process's CPU seconds minus the devices' and the rounds';
* the helper (validated only): CPU seconds of its process (``/proc/PID/stat``, Linux) while the
  devices upload their shares (MASKED_INPUT open: L − 1 uploads before the last device's step,
  scaled to L) and while the stage closes (the last device's step, less one upload: the helper
  receives the coordinator's query, prepares its verifier share of every report, decides and
  sums);
* the round's wall time as the coordinator saw it (every stage's open and closing seconds,
  ``round_s``; the driver's loop, ``wall_s``, can outlast it while a closing holds the round)
  and the load average; then the study is decoded (and its aggregate checked) and its final
  state reported. A device's send that outlasts its RPC timeout (the last one of a stage that
  closes inside it) is counted in ``late_sends`` and sent again on its next step.

Usage: python benchmarks/bench_validated_cost.py [--devices 100 1000] [--m 1000]
           [--stage-timeout 3600] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
from threadpoolctl import threadpool_limits

from fedsketch.common.choices import CAP_HEADROOM
from fedsketch.common.pb import fedsketch_pb2 as pb
from fedsketch.common.study.validated import validity_delta
from fedsketch.server.sim.config import SimConfig
from fedsketch.server.sim.devices import make_agents
from fedsketch.server.sim.helper_process import start_helper
from fedsketch.server.sim.simulate import (
    _study_spec,
    loopback_coordinator,
    pooled_data,
    split_records,
)

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat`` fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def run_once(devices: int, m: int, validated: bool, stage_timeout: float, x: np.ndarray,
             labels: np.ndarray) -> dict:
    """One round (module docstring) of ``devices`` devices on records ``x``; its measurements."""
    degree = None if validated else math.ceil(3 * math.log2(devices))
    cfg = SimConfig(devices=devices, records=1000 * devices, m=m, feature="quantized", r=1,
                    epsilon=1.0, secure_aggregation=True, degree=degree,
                    stage_timeout=stage_timeout, validation="helper" if validated else None)
    parts = split_records(labels, devices, "iid", np.random.default_rng(0))
    spec = _study_spec(cfg, max(CAP_HEADROOM * 1000, max(p.size for p in parts)))  # simulate's cap
    with tempfile.TemporaryDirectory(prefix="fedsketch-vcost-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        helper = start_helper(stack, folder / "helper") if validated else None
        if helper is not None:
            spec = helper.name_in(spec)
        loop = loopback_coordinator(stack, folder, helper_token=None if helper is None else helper.token)
        op, meta = loop.operator, loop.meta
        tokens = list(op.IssueTokens(pb.IssueTokensRequest(count=devices), metadata=meta).tokens)
        study = op.CreateStudy(pb.CreateStudyRequest(spec_json=spec.to_json()), metadata=meta)
        agents = make_agents(stack, loop.target, loop.certs.ca_cert, folder, tokens,
                             [x[idx] for idx in parts], 1.0,
                             delta=validity_delta(spec) if validated else 0.0)

        def show() -> pb.Study:
            return op.ShowStudy(pb.StudyRef(study_id=study.study_id), metadata=meta)

        cpu, late = [0.0] * devices, 0
        h1, per_upload = None, 0.0
        process0, wall0 = time.process_time(), time.perf_counter()
        while (s := show()).state not in (pb.DONE, pb.FAILED, pb.DECODING):
            # the first MASKED_INPUT pass (the uploads; the closing that follows may outlast it)
            proving = helper is not None and s.stage == pb.MASKED_INPUT and h1 is None
            h0 = process_cpu(helper.pid) if proving else 0.0
            for i, agent in enumerate(agents):
                if proving and i == devices - 1:
                    h1 = process_cpu(helper.pid)
                c = time.thread_time()
                try:
                    agent.step()
                except grpc.RpcError as exc:  # the stage's closing outlasted the RPC's timeout
                    if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
                    late += 1
                cpu[i] += time.thread_time() - c
            if proving:
                per_upload = (h1 - h0) / max(1, devices - 1)
        wall = time.perf_counter() - wall0
        helper_cpu = None if helper is None or h1 is None else {  # closed before DECODING shows
            "upload": per_upload * devices, "close": process_cpu(helper.pid) - h1 - per_upload}
        rnd = loop.coordinator.round_of(study.study_id)
        process = time.process_time() - process0
        t = time.perf_counter()
        while (s := show()).state not in (pb.DONE, pb.FAILED):  # decoded (and checked) or not
            time.sleep(0.2)
        decode = time.perf_counter() - t
        return {
            "L": devices, "mode": "validated" if validated else "secagg+", "degree": degree,
            "state": pb.StudyState.Name(s.state), "detail": s.detail,
            "device_cpu_s": statistics.median(cpu), "device_cpu_max_s": max(cpu),
            "bytes_up": statistics.median(a.bytes_sent for a in agents),
            "bytes_down": statistics.median(a.bytes_received for a in agents),
            "coordinator_cpu_s": dict(rnd.stage_cpu), "stage_open_s": dict(rnd.stage_open),
            "stage_close_s": dict(rnd.stage_seconds),
            "other_cpu_s": process - sum(cpu) - sum(rnd.stage_cpu.values()),
            "helper_cpu_s": helper_cpu,
            "valid": None if getattr(rnd, "validation", None) is None else len(rnd.validation["valid"]),
            "late_sends": late, "wall_s": wall, "decode_s": decode, "load": os.getloadavg(),
            "round_s": sum(rnd.stage_open.values()) + sum(rnd.stage_seconds.values()),
        }


def stages_text(r: dict) -> str:
    """Each stage: coordinator CPU s / open wall s / closing wall s."""
    return "; ".join(f"{k.lower()} {r['coordinator_cpu_s'].get(k, 0.0):.2f} / "
                     f"{r['stage_open_s'].get(k, 0.0):.1f} / {r['stage_close_s'].get(k, 0.0):.2f}"
                     for k in r["stage_open_s"])


def helper_text(h: dict | None) -> str:
    """The helper's CPU seconds: uploads; closing (— without a helper)."""
    return "—" if h is None else f"{h['upload']:.2f}; {h['close']:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--m", type=int, default=1000, help="frequencies m (default: %(default)s)")
    ap.add_argument("--stage-timeout", type=float, default=3600.0,
                    help="each stage's timeout, seconds (default: %(default)s; nothing should time out)")
    ap.add_argument("--json", type=Path, help="also write every row as JSON lines here")
    args = ap.parse_args()
    rows = []
    with threadpool_limits(1):
        for devices in args.devices:
            data = pooled_data(SimConfig(devices=devices, records=1000 * devices, m=args.m))
            for validated in (False, True):
                rows.append(run_once(devices, args.m, validated, args.stage_timeout, data.x,
                                     data.labels))
                print(json.dumps(rows[-1]), flush=True)
                if args.json is not None:
                    with args.json.open("a") as out:
                        out.write(json.dumps(rows[-1]) + "\n")
    print("\n| L | study | state | device CPU s (median; max) | bytes up per device | bytes down "
          "per device | coordinator per stage: CPU s / open s / closing s | coordinator CPU s "
          "(all stages) | other in-process CPU s | helper CPU s (uploads; closing) | round wall s "
          "| load (1, 5, 15 min) |")
    print("|---" * 12 + "|")
    for r in rows:
        h = r["helper_cpu_s"]
        print(f"| {r['L']} | {r['mode']}{'' if r['degree'] is None else ' degree ' + str(r['degree'])} "
              f"| {r['state']} | {r['device_cpu_s']:.3f}; {r['device_cpu_max_s']:.3f} | "
              f"{r['bytes_up']:,.0f} | {r['bytes_down']:,.0f} | {stages_text(r)} | "
              f"{sum(r['coordinator_cpu_s'].values()):.2f} | {r['other_cpu_s']:.1f} | "
              f"{helper_text(h)} | {r['round_s']:.1f} | "
              f"{', '.join(f'{v:.1f}' for v in r['load'])} |")


if __name__ == "__main__":
    main()
