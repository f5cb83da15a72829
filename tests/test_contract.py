"""The checked-in generated code matches ``proto/``, and the package layering holds."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


#: Who may not import whom, by fedsketch package prefix (the layering of README's Layout).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "fedsketch.common": ("fedsketch.client", "fedsketch.server"),
    "fedsketch.client": ("fedsketch.server",),
    # the coordinator product never reaches into the research bench, the simulator or the CLI
    "fedsketch.server.service": ("fedsketch.server.bench", "fedsketch.server.sim", "fedsketch.server.cli"),
    "fedsketch.server.store": ("fedsketch.server.bench", "fedsketch.server.sim", "fedsketch.server.cli",
                               "fedsketch.server.service"),
    "fedsketch.server.decode": ("fedsketch.server.bench", "fedsketch.server.sim", "fedsketch.server.cli",
                                "fedsketch.server.service", "fedsketch.server.store"),
    # and the bench does not depend on the service: it compares mechanisms on one dataset
    "fedsketch.server.bench": ("fedsketch.server.service", "fedsketch.server.store", "fedsketch.server.sim",
                               "fedsketch.server.cli"),
}


def module_name(root: Path, path: Path) -> str:
    """The dotted name of a source file under ``root`` (common/x.py → fedsketch.common.x)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["fedsketch", *parts])


def imports_of(root: Path, path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (lazy imports included), with
    relative imports resolved against its package."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def violations(root: Path) -> list[tuple[str, str]]:
    """(module, imported) pairs that break :data:`FORBIDDEN`."""
    bad = []
    for folder in ("common", "client", "server"):
        for path in sorted((root / folder).rglob("*.py")):
            if "pb" in path.relative_to(root).parts:
                continue
            name = module_name(root, path)
            rules = [banned for owner, banned in FORBIDDEN.items()
                     if name == owner or name.startswith(owner + ".")]
            for imported in sorted(imports_of(root, path)):
                if any(imported == b or imported.startswith(b + ".") for ban in rules for b in ban):
                    bad.append((name, imported))
    return bad


def test_layering():
    assert violations(ROOT) == []


def test_nothing_below_the_python_api_imports_it():
    """The top-level package (api/, imported as ``fedsketch``) sits above common, client and
    server: none of them imports it, so a device never loads it."""
    bad = []
    for folder in ("common", "client", "server"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for imported in sorted(imports_of(ROOT, path)):
                parts = imported.split(".")
                if parts[0] == "fedsketch" and (len(parts) == 1 or parts[1] not in ("common", "client",
                                                                                    "server")):
                    bad.append((module_name(ROOT, path), imported))
    assert bad == []


@pytest.mark.parametrize(("where", "line"), [
    ("server/service/rogue.py", "from fedsketch.server.bench.task import Task\n"),
    ("server/service/rogue.py", "def f():\n    from ..bench import compare\n"),
    ("server/bench/rogue.py", "from fedsketch.server.service import coordinator\n"),
    ("server/store/rogue.py", "import fedsketch.server.cli.main\n"),
    ("client/rogue.py", "from fedsketch.server.decode import clompr\n"),
    ("common/rogue.py", "from ..client import ledger\n"),
])
def test_layering_check_catches_a_crossing_import(tmp_path, where, line):
    """The checker itself: a copy of the tree with one crossing import (absolute, relative or
    lazy inside a function) fails it, and names that import."""
    for folder in ("common", "client", "server"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / where).write_text(line)
    found = violations(tmp_path)
    assert [bad for bad in found if bad[0] == module_name(tmp_path, tmp_path / where)], found


#: A module longer than this says why in its docstring (a sentence containing "lines").
MAX_MODULE_LINES = 400


def test_modules_stay_small_or_say_why():
    """Small modules named for what they hold: none over MAX_MODULE_LINES lines unless its
    docstring gives the reason (generated protobuf code aside)."""
    long = []
    for folder in ("api", "common", "client", "server"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "pb" in path.relative_to(ROOT).parts:
                continue
            text = path.read_text()
            lines = text.count("\n")
            if lines > MAX_MODULE_LINES and "lines" not in (ast.get_docstring(ast.parse(text)) or ""):
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == []


def test_readme_layout_names_every_package():
    """README's Layout map and the folders agree: every package is on the map, every folder on
    the map exists."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Layout"):].split("```")[1]
    mapped, parent = set(), ""
    for line in block.splitlines():
        name = line.split(" ", 1)[0] if not line.startswith(" ") else line.strip().split(" ", 1)[0]
        if not name.endswith("/"):
            continue
        if line.startswith(" "):
            mapped.add(parent + name.rstrip("/"))
        else:
            parent = name
            mapped.add(name.rstrip("/"))
    packages = {str(p.parent.relative_to(ROOT)) for folder in ("common", "client", "server")
                for p in (ROOT / folder).glob("*/__init__.py") if p.parent.name != "pb"}
    assert packages <= mapped, packages - mapped
    assert all((ROOT / name).is_dir() for name in mapped), [n for n in mapped if not (ROOT / n).is_dir()]
