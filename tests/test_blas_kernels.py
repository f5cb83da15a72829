"""The float-sensitive tests hold on every x86-64 OpenBLAS kernel, not only on this CPU's default.

numpy's OpenBLAS picks its kernels by CPU (Haswell on AVX2, SkylakeX on AVX-512); they sum in
different orders, so a seeded chain of float operations ends elsewhere on another machine. The
modules marked ``blas`` (seeded utility medians, samplers checked against references) are run
again here in a child pytest with ``OPENBLAS_CORETYPE`` forcing each kernel in turn, so one
machine checks what an AVX2 and an AVX-512 machine would see. The kernel the suite itself already
runs on is skipped (the suite is that run), and so is a kernel the CPU cannot execute. The child
collects only the files that mark tests ``blas`` (the mark is spelt ``mark.blas``), not the whole
suite; in a run that collected the marked tests, the test checks that their files are among them.
The tests of ``blas_measured.BLAS_NOT_RERUN`` are left out of the child (deselected by node id):
measured, their asserted values do not move with the kernel (see there), so a rerun checks nothing
new.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import threadpoolctl

ROOT = Path(__file__).resolve().parent.parent

#: OpenBLAS core type → the CPU flag it needs (Linux /proc/cpuinfo name).
KERNELS = {"Haswell": "avx2", "SkylakeX": "avx512f"}

PROBE = ("import json, numpy, threadpoolctl; "
         "print(json.dumps(sorted({i.get('architecture') for i in threadpoolctl.threadpool_info() "
         "if i['internal_api'] == 'openblas'})))")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _marked_files() -> list[str]:
    """The test files (relative to the repository) whose text marks tests ``blas``."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.blas" in p.read_text())


def _current_kernels() -> set[str]:
    import numpy  # noqa: F401  (loads OpenBLAS so that threadpoolctl sees it)

    return {i.get("architecture") for i in threadpoolctl.threadpool_info()
            if i["internal_api"] == "openblas"}


@pytest.mark.slow
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_blas_marked_modules_pass_under_kernel(kernel, tmp_path, request):
    if KERNELS[kernel] not in _cpu_flags():
        pytest.skip(f"this CPU lacks {KERNELS[kernel]}, so it cannot run OpenBLAS's {kernel} kernels")
    if _current_kernels() == {kernel}:
        pytest.skip(f"the suite itself runs on OpenBLAS's {kernel} kernels")
    files = _marked_files()
    marked = {str(item.path.relative_to(ROOT)) for item in request.session.items
              if item.get_closest_marker("blas")}
    assert marked <= set(files), sorted(marked - set(files))  # a mark the text search missed
    env = dict(os.environ, OPENBLAS_CORETYPE=kernel)
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                           check=True)
    assert json.loads(probe.stdout) == [kernel], probe.stdout  # the override took effect
    from blas_measured import BLAS_NOT_RERUN

    collected = {item.nodeid for item in request.session.items}
    seen = {nodeid.split("::")[0] for nodeid in collected}
    stale = [n for n in BLAS_NOT_RERUN if n.split("::")[0] in seen and n not in collected]
    assert stale == [], stale  # renamed or removed: the list names tests that no longer exist
    skipped = [f"--deselect={nodeid}" for nodeid in BLAS_NOT_RERUN]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "blas", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "child"), *skipped, *files],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = "\n".join(run.stdout.splitlines()[-40:])
    assert run.returncode == 0, f"blas-marked tests fail under OPENBLAS_CORETYPE={kernel}:\n{tail}"
    assert " passed" in tail and " deselected" in tail, tail
