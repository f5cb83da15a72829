"""The checked-in generated code matches ``proto/``, and the package layering holds."""

from __future__ import annotations

import ast
import functools
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


#: Who may not import whom, by fedsketch package prefix (the layering of docs/layout.md).
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


@functools.cache
def import_nodes(text: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of a module's source ``text``, at any depth of the file. Each
    distinct text is parsed once: the checkers' own tests below run them on copies of the tree
    that differ from it in one or two files (read only, so sharing the nodes is safe)."""
    return tuple(node for node in ast.walk(ast.parse(text))
                 if isinstance(node, (ast.Import, ast.ImportFrom)))


def imports_of(root: Path, path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (lazy imports included), with
    relative imports resolved against its package."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in import_nodes(path.read_text()):
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
    ("server/store/rogue.py", "import fedsketch.server.cli.local\n"),
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


#: The rooms of ``common``, lowest first, written down once: a module imports only modules of its
#: own room or of a room below it. The ground floor is the modules directly in ``common/`` (and the
#: generated ``pb``); the command line's shared helpers (``cli``) are the top.
COMMON_ROOMS: tuple[tuple[str, ...], ...] = (
    ("atomicfile", "choices", "exactmath", "features", "helptext", "spec_fields", "text", "pb"),
    ("net",),
    ("validity",),
    ("data",),
    ("dp",),
    ("sketch",),
    ("secagg",),
    ("study",),
    ("cli",),
)
#: Where each folder's modules are named from (api/ is the top-level package ``fedsketch``).
PACKAGES = {"api": (), "common": ("common",), "client": ("client",), "server": ("server",)}


def source_modules(root: Path) -> dict[str, Path]:
    """Every module of the package (generated protobuf code aside), by dotted name."""
    found = {}
    for folder, prefix in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            if "pb" in path.relative_to(root).parts:
                continue
            parts = [*prefix, *path.relative_to(root / folder).with_suffix("").parts]
            if parts and parts[-1] == "__init__":
                parts.pop()
            found[".".join(["fedsketch", *parts])] = path
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the package's modules it imports (at any depth, lazy and TYPE_CHECKING imports
    included): ``from X import y`` counts as an import of X.y when that is a module, else of X."""
    modules = source_modules(root)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in import_nodes(path.read_text()):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def cycles(root: Path) -> list[list[str]]:
    """The import cycles of the package: its graph's strongly connected components of more than
    one module (Tarjan's algorithm, iterative)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def room_of(module: str) -> int | None:
    """The floor of a ``fedsketch.common`` module in :data:`COMMON_ROOMS` (None outside common)."""
    parts = module.split(".")
    if parts[:2] != ["fedsketch", "common"] or len(parts) < 3:
        return None
    return next((floor for floor, rooms in enumerate(COMMON_ROOMS) if parts[2] in rooms), -1)


def room_violations(root: Path) -> list[tuple[str, str]]:
    """(module, imported) pairs of ``common`` where a room imports a room above it, or a module
    sits in no room of :data:`COMMON_ROOMS`."""
    bad = []
    for name, imported in sorted(import_graph(root).items()):
        floor = room_of(name)
        if floor is None or name == "fedsketch.common":
            continue
        if floor < 0:
            bad.append((name, "(no room)"))
        bad += [(name, other) for other in sorted(imported)
                if (room_of(other) or 0) > floor]
    return bad


def test_no_import_cycle_anywhere():
    assert cycles(ROOT) == []


def test_common_rooms_import_only_rooms_below():
    assert room_violations(ROOT) == []


def _copy_tree(tmp_path: Path) -> None:
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))


@pytest.mark.parametrize("files", [
    {"common/sketch/rogue_a.py": "from . import rogue_b\n",
     "common/sketch/rogue_b.py": "from . import rogue_a\n"},
    {"server/cli/rogue.py": "def f():\n    from fedsketch.cli import app\n",
     "api/cli.py": "from fedsketch.server.cli import rogue\n"},
    {"common/study/rogue.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .rogue_too import X\n",
     "common/study/rogue_too.py": "from .rogue import Y\n"},
])
def test_cycle_check_catches_a_planted_cycle(tmp_path, files):
    """The checker itself: two modules that import each other (plainly, lazily inside a function,
    or for annotations only) are reported as one cycle."""
    _copy_tree(tmp_path)
    for where, text in files.items():
        (tmp_path / where).write_text(text)
    found = cycles(tmp_path)
    planted = {".".join(["fedsketch", *Path(w).with_suffix("").parts[1 if w.startswith("api/") else 0:]])
               for w in files}
    assert any(planted <= set(component) for component in found), found


@pytest.mark.parametrize(("where", "line"), [
    ("common/dp/rogue.py", "from ..study.study import StudySpec\n"),
    ("common/net/rogue.py", "from fedsketch.common.sketch import box\n"),
    ("common/features.py", "def f():\n    from .data import dataio\n"),
    ("common/rogue.py", "x = 1\n"),
])
def test_room_check_catches_an_import_upwards(tmp_path, where, line):
    """A module importing a room above its own, or sitting in no room, is reported."""
    _copy_tree(tmp_path)
    (tmp_path / where).write_text(line)
    name = ".".join(["fedsketch", *Path(where).with_suffix("").parts])
    assert [bad for bad in room_violations(tmp_path) if bad[0] == name], room_violations(tmp_path)


def test_at_most_twelve_modules_directly_in_common():
    """common/ keeps its ground floor small: the rest lives in rooms, each saying what it holds."""
    direct = sorted(p.name for p in (ROOT / "common").glob("*.py") if p.name != "__init__.py")
    assert len(direct) <= 12, direct
    for room in sorted(p for p in (ROOT / "common").iterdir() if (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        assert doc.splitlines()[0].endswith(".") if doc else False, (
            f"{room.name}/__init__.py needs a docstring whose first line says what the room holds")


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
    """The Layout map (docs/layout.md) and the folders agree: every package is on the map, every
    folder on the map exists."""
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text[text.index("# Layout"):].split("```text\n")[1].split("```")[0]
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
