"""One convention across commands: r defaults to 1 everywhere, --json on the commands that print
results, the operator's options from FEDSKETCH_* variables (and --token-file on every operator
command, `result` included), and --help that says why create-study needs --scale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import OPERATOR_TOKEN

from fedsketch.common.sketch.sketchfile import load_sketch

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([FEDSKETCH, *args], capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env})


def test_synth_and_sketch_print_json_and_r_defaults_to_one(tmp_path):
    x, s = tmp_path / "x.npy", tmp_path / "s.npz"
    # --records: simulate's name for the count, an alias of --n in synth gmm and compare
    done = run("synth", "gmm", "--out", str(x), "--records", "2000", "--k", "3", "--d", "2", "--json", "-q")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["out"] == str(x) and made["n"] == 2000 and np.asarray(made["centres"]).shape == (3, 2)
    done = run("sketch", str(x), "--out", str(s), "--m", "50", "--scale", "1", "--epsilon", "inf",
               "--json", "-q")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["r"] == 1 == load_sketch(s).spec.r
    assert out["m"] == 50 and out["n"] == 2000 and out["epsilon"] == "inf" and out["noise"] == []
    done = run("sketch", str(x), "--out", str(s), "--m", "50", "--epsilon", "1", "--json", "-q")
    out = json.loads(done.stdout)
    assert out["calibration"]["sigma"] == out["scale"] and out["noise"][0]["target"]
    centroids = tmp_path / "c.json"
    centroids.write_text(json.dumps({"centroids": made["centres"]}))
    done = run("evaluate", "--data", str(x), "--centroids", str(centroids), "--quiet", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr  # evaluate has --quiet too
    assert json.loads(done.stdout)["sse_per_n"] > 0


def test_certs_init_prints_json(tmp_path):
    done = run("certs", "init", "--out", str(tmp_path / "c"), "--host", "127.0.0.1", "--json")
    assert done.returncode == 0, done.stderr
    paths = json.loads(done.stdout)
    assert Path(paths["ca_cert"]).exists() and Path(paths["server_key"]).exists()
    assert paths["hosts"] == ["127.0.0.1"]


def test_operator_commands_read_the_environment_and_agree(coordinator_round, tmp_path):
    token = tmp_path / "operator.token"
    token.write_text(OPERATOR_TOKEN + "\n")
    env = {"FEDSKETCH_COORDINATOR": coordinator_round.target,
           "FEDSKETCH_CA": str(coordinator_round.certs.ca_cert),
           "FEDSKETCH_OPERATOR_TOKEN_FILE": str(token)}
    done = run("coordinator", "create-study", "--name", "s", "--d", "2", "--k", "2",
               "--bounds", "-5:5", "--scale", "1", "--epsilon", "1", "--m", "40", "--json", env=env)
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout)
    assert created["spec"]["sketch"]["r"] == 1  # the same default as sketch's and simulate's
    assert created["spec"]["name"] == "s" and created["study_id"]
    tokens = run("coordinator", "tokens", "--count", "2", env=env)
    assert tokens.returncode == 0 and len(tokens.stdout.split()) == 2, tokens.stderr
    # result reads the operator token like every operator command: from the environment here
    done = run("coordinator", "result", created["study_id"], env=env)
    assert done.returncode == 1 and "FAILED_PRECONDITION" in done.stderr, done.stderr


def test_device_budget_reads_the_ledger_from_the_environment(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    assert run("device", "init", "--ledger", str(ledger), "--budget", "2").returncode == 0
    done = run("device", "budget", "--json", env={"FEDSKETCH_LEDGER": str(ledger)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sources"]["default"]["epsilon"] == 2


def test_help_says_what_scale_auto_costs_and_how_it_chooses_and_names_only_repository_files():
    text = run("coordinator", "create-study", "--help", env={"COLUMNS": "200"}).stdout
    text = " ".join(text.replace("│", " ").split())  # rich wraps the help inside a box
    assert "'auto'" in text and "round 0" in text and "ε_0 = --auto-fraction·ε" in text
    assert "0.8·typical-direction fit" in text and "box's mean half-width / 7" in text
    for args in (["synth", "gmm", "--help"], ["simulate", "--help"]):
        text = run(*args, env={"COLUMNS": "200"}).stdout
        assert "paper 004" in text and "docs/REFERENCES.md" in text
        assert "MECHANISMS §" not in text
