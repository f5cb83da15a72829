"""The command line starts at once: ``--help``, ``--version`` and ``device budget`` load none of the
heavy packages (numpy, scipy, grpc, scikit-learn, pyarrow), which load only inside the commands
that use them. Tested on the set of modules a fresh interpreter holds after the command's code
path (not on time: benchmarks/bench_startup.py measures that)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedsketch.common.choices import SECAGG_STAGES
from fedsketch.server.sim.simulate import DROPOUT_STAGES

#: Top-level packages no start-up path may load (grpc_tools and sklearn are dev/bench extras,
#: psycopg the PostgreSQL store's, in the postgres extra).
HEAVY = ("numpy", "scipy", "grpc", "grpc_tools", "sklearn", "pyarrow", "psycopg", "psycopg_pool")

RUN = """
import json, sys
sys.argv = ["fedsketch", *json.loads(sys.argv[1])]
from fedsketch.cli import app
try:
    app()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
sys.stderr.write("MODULES " + json.dumps([code, sorted(sys.modules)]) + "\\n")
"""


def loaded(args: list[str], cwd) -> tuple[int, set[str]]:
    """(Exit status, top-level packages loaded) of ``fedsketch ARGS`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(args)], capture_output=True,
                          text=True, cwd=cwd, timeout=120)
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("MODULES ")]
    assert line, done.stderr
    code, modules = json.loads(line[-1].removeprefix("MODULES "))
    return code, {m.split(".")[0] for m in modules}


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], ["sketch", "--help"], ["synth", "gmm", "--help"],
    ["simulate", "--help"], ["compare", "--help"], ["coordinator", "create-study", "--help"],
    ["coordinator", "serve", "--help"],
    ["device", "run", "--help"], ["certs", "init", "--help"],
])
def test_help_and_version_load_nothing_heavy(args, tmp_path):
    code, top = loaded(args, tmp_path)
    assert code == 0
    assert top.isdisjoint(HEAVY), sorted(top & set(HEAVY))
    assert "cryptography" not in top  # the TLS and signing code loads with the commands too
    assert "fedsketch" in top


def test_device_budget_loads_nothing_heavy(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    assert loaded(["device", "init", "--ledger", str(ledger), "--budget", "1"], tmp_path)[0] == 0
    code, top = loaded(["device", "budget", "--ledger", str(ledger), "--json"], tmp_path)
    assert code == 0
    assert top.isdisjoint(HEAVY), sorted(top & set(HEAVY))


def test_a_command_that_computes_still_loads_what_it_needs(tmp_path):
    """The guard above would pass vacuously if the runner never reached a command."""
    code, top = loaded(["synth", "gmm", "--out", str(tmp_path / "x.npy"), "--n", "10", "--quiet"],
                       tmp_path)
    assert code == 0 and "numpy" in top
    assert (tmp_path / "x.npy").exists()


def test_the_help_s_stage_names_are_the_protocol_s():
    assert SECAGG_STAGES == DROPOUT_STAGES


def test_the_coordinator_and_the_device_daemon_start_without_scipy():
    """``coordinator serve`` and ``device run`` import their service modules at start-up (every
    restart of the crash tests pays it again); SciPy loads only when a study is decoded or a
    Gaussian scale calibrated, which took it from about 0.65 to 0.35 s of CPU per start."""
    code = ("import json, sys; import fedsketch.server.service.api, fedsketch.client.daemon, "
            "fedsketch.server.store; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    top = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                        check=True, timeout=120).stdout))
    assert {"numpy", "grpc", "fedsketch"} <= top  # the modules did load
    assert "scipy" not in top
