"""The checked-in generated code matches ``proto/``, and the package layering holds."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_matches_the_proto(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Ifedsketch/common/pb=proto",
         f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
         "proto/fedsketch.proto"],
        cwd=ROOT, check=True)
    made = tmp_path / "fedsketch" / "common" / "pb"
    names = sorted(p.name for p in made.iterdir())
    assert names == ["fedsketch_pb2.py", "fedsketch_pb2.pyi", "fedsketch_pb2_grpc.py"]
    for name in names:
        assert (ROOT / "common" / "pb" / name).read_bytes() == (made / name).read_bytes(), (
            f"common/pb/{name} is stale: run `make proto`")


def _imports(folder: str) -> set[tuple[str, str]]:
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add((path.name, node.module))
            elif isinstance(node, ast.Import):
                found.update((path.name, a.name) for a in node.names)
    return found


def test_layering():
    for name, module in _imports("common"):
        assert not module.startswith(("fedsketch.client", "fedsketch.server")), (name, module)
    for name, module in _imports("client"):
        assert not module.startswith("fedsketch.server"), (name, module)
