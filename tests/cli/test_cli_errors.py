"""Errors in words: the installed ``fedsketch`` against a real TLS coordinator on loopback, with a
wrong CA, a missing CA file, a missing token file, a certificate for another host, and a port
where nothing listens. Each error is one line that names the problem and the option to check;
no TLS library text (BoringSSL's ": OK", SSL_ERROR_...) and no gRPC core log line reaches the
user, unless ``--verbose``."""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import OPERATOR_TOKEN

from fedsketch.common.net.tls import init_certs, server_tls
from fedsketch.server.service.api import build_server
from fedsketch.server.store import open_store

FEDSKETCH = str(Path(sys.executable).with_name("fedsketch"))
#: What must not reach the user: BoringSSL's text, its trailing ": OK", a gRPC core log line
#: (absl's "E0000 00:00:..." / "I1126 02:23:32.571005 ..." prefix), gRPC's own phrasing.
RAW = re.compile(r"OPENSSL|SSL_ERROR|BoringSSL|TSI_|: OK\b|^[EIWF]\d{4} |failed to connect to all "
                 r"addresses|UNAVAILABLE", re.MULTILINE)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FEDSKETCH, *args], capture_output=True, text=True, timeout=120)


def failed_in_words(done: subprocess.CompletedProcess, *words: str) -> str:
    """The one error line of a failed command, checked for ``words`` and for raw library text."""
    assert done.returncode == 1, done.stderr
    assert not RAW.search(done.stderr), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def served(coordinator_round, tmp_path):
    """(HOST:PORT of a real TLS coordinator whose certificate names localhost and 127.0.0.1,
    the operator token file)."""
    token = tmp_path / "operator.token"
    token.write_text(OPERATOR_TOKEN + "\n")
    return coordinator_round.target, token


def test_the_right_ca_works(served, certs):
    target, token = served
    done = run("coordinator", "tokens", "--coordinator", target, "--ca", str(certs.ca_cert),
               "--token-file", str(token))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 1


def test_a_wrong_ca_is_named(served, tmp_path):
    target, token = served
    other = init_certs(tmp_path / "other", ["127.0.0.1"])
    args = ("coordinator", "tokens", "--coordinator", target, "--ca", str(other.ca_cert),
            "--token-file", str(token))
    failed_in_words(run(*args), f"the coordinator at {target}",
                    f"is not signed by the CA in --ca {other.ca_cert}")
    failed_in_words(run("coordinator", "result", "S", "--coordinator", target, "--ca",
                        str(other.ca_cert), "--token-file", str(token)),
                    f"is not signed by the CA in --ca {other.ca_cert}")
    verbose = run("--verbose", *args)
    assert verbose.returncode == 1
    assert "is not signed by the CA in --ca" in verbose.stderr
    assert "[grpc: " in verbose.stderr and "CERTIFICATE_VERIFY_FAILED" in verbose.stderr


def test_no_ca_means_the_system_s_which_did_not_sign_it(served):
    target, token = served
    failed_in_words(run("coordinator", "tokens", "--coordinator", target, "--token-file", str(token)),
                    "no CA of this system signed", "--ca")


def test_a_missing_ca_file_is_named(served, tmp_path):
    target, token = served
    missing = tmp_path / "nope.pem"
    failed_in_words(run("coordinator", "tokens", "--coordinator", target, "--ca", str(missing),
                        "--token-file", str(token)), f"--ca {missing}: cannot read")


def test_a_missing_token_file_is_named(served, certs, tmp_path):
    target, _ = served
    missing = tmp_path / "elsewhere" / "operator.token"
    line = failed_in_words(run("coordinator", "tokens", "--coordinator", target, "--ca",
                               str(certs.ca_cert), "--token-file", str(missing)),
                           f"--token-file {missing}: cannot read the operator token",
                           "`coordinator serve` writes it")
    assert "Errno" not in line
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token\n")
    failed_in_words(run("coordinator", "tokens", "--coordinator", target, "--ca", str(certs.ca_cert),
                        "--token-file", str(wrong)),
                    "PERMISSION_DENIED: bad operator credential (check --token-file")


def test_a_certificate_for_another_host_is_named(tmp_path, certs):
    other = init_certs(tmp_path / "other", ["coordinator.example.org"])
    store = open_store(tmp_path / "coordinator.db")
    server, coordinator, port = build_server(
        store, hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(), "127.0.0.1:0",
        server_tls(other.server_cert, other.server_key))
    token = tmp_path / "operator.token"
    token.write_text(OPERATOR_TOKEN)
    try:
        failed_in_words(run("coordinator", "tokens", "--coordinator", f"127.0.0.1:{port}", "--ca",
                            str(other.ca_cert), "--token-file", str(token)),
                        "the coordinator's certificate does not name 127.0.0.1", "--coordinator")
    finally:
        server.stop(grace=None).wait()
        coordinator.stop()
        store.close()


def test_an_unreachable_port_is_named(certs, tmp_path):
    with socket.socket() as sock:  # a port that was free a moment ago, and nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = tmp_path / "operator.token"
    token.write_text(OPERATOR_TOKEN)
    failed_in_words(run("coordinator", "tokens", "--coordinator", f"127.0.0.1:{port}", "--ca",
                        str(certs.ca_cert), "--token-file", str(token)),
                    f"cannot reach the coordinator at 127.0.0.1:{port}: connection refused")


def test_the_daemon_logs_the_same_words(served, tmp_path):
    target, _ = served
    other = init_certs(tmp_path / "other", ["127.0.0.1"])
    data = tmp_path / "x.csv"
    data.write_text("1,2\n3,4\n")
    done = run("device", "run", "--coordinator", target, "--ca", str(other.ca_cert), "--data",
               str(data), "--ledger", str(tmp_path / "ledger"), "--budget", "1", "--token", "t",
               "--once")
    assert done.returncode == 1
    assert f"cannot enroll yet: the coordinator at {target} has a certificate that is not signed " \
           f"by the CA in --ca {other.ca_cert}" in done.stderr
    assert not RAW.search(done.stderr), done.stderr


def test_serve_and_the_device_name_their_files_options(tmp_path, certs):
    other = init_certs(tmp_path / "other", ["127.0.0.1"])
    db, token = tmp_path / "c.db", tmp_path / "operator.token"
    tls = ("--cert", str(certs.server_cert), "--key", str(certs.server_key))
    for args, words in (
            (("--db", str(tmp_path / "no" / "c.db"), *tls), f"--db {tmp_path / 'no' / 'c.db'}: folder"),
            (("--db", str(db), *tls, "--token-file", str(tmp_path / "no" / "t")),
             f"--token-file {tmp_path / 'no' / 't'}: folder {tmp_path / 'no'} does not exist"),
            (("--db", str(db), "--cert", str(tmp_path / "none.pem"), "--key", str(certs.server_key)),
             "none.pem: cannot read the TLS server certificate (--cert)"),
            (("--db", str(db), "--cert", str(certs.server_cert), "--key", str(other.server_key)),
             "the private key (--key) does not match the certificate in")):
        failed_in_words(run("coordinator", "serve", "--token-file", str(token), *args), words)
    assert not db.exists() and not token.exists()  # refused before anything was created
    failed_in_words(run("device", "init", "--ledger", str(tmp_path / "no" / "l"), "--budget", "1"),
                    f"--ledger {tmp_path / 'no' / 'l'}: folder {tmp_path / 'no'} does not exist")
    failed_in_words(run("evaluate", "--data", str(tmp_path / "x.npy"), "--centroids",
                        str(tmp_path / "c.json")), f"--centroids {tmp_path / 'c.json'}: cannot read")


def test_decode_names_a_file_that_is_no_sketch(tmp_path):
    """An .npy array or a text file given to decode is refused in words, not with a traceback or
    numpy's advice about pickles."""
    array, text = tmp_path / "X.npy", tmp_path / "S.npz"
    np.save(array, np.zeros((3, 2)))
    text.write_text("not a sketch\n")
    for path in (array, text):
        line = failed_in_words(run("decode", str(path), "--k", "2", "--bounds", "-1:1"),
                               f"{path}: not a sketch file")
        assert "pickle" not in line and "allow_pickle" not in line, line


def test_sketch_names_an_epsilon_that_is_no_number(tmp_path):
    """--epsilon is text (it takes 'inf'): a typo gets the option's name, not Python's float()."""
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((3, 2)))
    line = failed_in_words(run("sketch", str(data), "--out", str(tmp_path / "S.npz"), "--epsilon", "1,5"),
                           "--epsilon", "'1,5'")
    assert "could not convert" not in line
    assert not (tmp_path / "S.npz").exists()


def test_an_output_that_is_a_folder_is_refused_before_any_work(tmp_path):
    """--out naming an existing folder is refused up front, by the option's path, not after the
    work with the name of a hidden .partial file."""
    folder = tmp_path / "out"
    folder.mkdir()
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((3, 2)))
    for args in (("synth", "gmm", "--n", "10", "--out", str(folder)),
                 ("sketch", str(data), "--epsilon", "inf", "--scale", "1", "--out", str(folder))):
        line = failed_in_words(run(*args), f"{folder}: a folder")
        assert "partial" not in line, line
    assert list(folder.iterdir()) == [] and [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_evaluate_names_a_json_without_centroids(tmp_path):
    """The study JSON create-study prints is no result: evaluate says what it lacks."""
    data, study = tmp_path / "x.npy", tmp_path / "study.json"
    np.save(data, np.zeros((3, 2)))
    study.write_text('{"study_id": "st-1", "spec": {}}')
    line = failed_in_words(run("evaluate", "--data", str(data), "--centroids", str(study)),
                           f"{study}: no 'centroids'")
    assert "shape" not in line


def test_bounds_auto_with_a_share_of_all_epsilon_is_refused_in_words(tmp_path):
    """``--bounds auto`` in a federated study is its box round, at --box-fraction of ε: a share
    outside (0, 1) is refused by ``simulate`` and ``create-study`` (plain or secure) in one line,
    before any coordinator is reached."""
    data = tmp_path / "x.csv"
    data.write_text("a,b\n1,2\n3,4\n5,6\n")
    token = tmp_path / "token"
    token.write_text("t\n")
    for args in (("simulate", "--data", str(data), "--bounds", "auto", "--k", "2", "--devices", "2",
                  "--scale", "1", "--box-fraction", "1"),
                 ("coordinator", "create-study", "--coordinator", "127.0.0.1:1", "--token-file",
                  str(token), "--ca", str(token), "--name", "a", "--d", "2", "--k", "2", "--bounds",
                  "auto", "--scale", "1", "--epsilon", "1", "--secure-aggregation",
                  "--max-records", "100", "--max-dropout", "0", "--max-colluders", "0",
                  "--min-devices", "3", "--box-fraction", "0")):
        failed_in_words(run(*args), "box round's share of ε must be in (0, 1)")
