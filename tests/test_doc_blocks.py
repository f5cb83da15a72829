"""Every shell and Python block of README.md and docs/*.md runs, as a reader would paste it.

A fence is ```bash or ```sh (run with bash), ```python (run with the venv's Python), or ```text,
```console or ```json (shown, not run: maps, formulas, terminal sessions, output samples; a
```json block must parse). Any other fence, an untagged one included, fails
:func:`test_every_fence_is_tagged`, so no block escapes. A document's runnable blocks run in
order, each in a process of its own (so each block must stand alone, as a pasted one does), in
one temporary folder per document, with the venv's ``bin`` first on PATH and
``FEDSKETCH_COORDINATOR``, ``FEDSKETCH_CA`` and ``FEDSKETCH_OPERATOR_TOKEN_FILE`` unset. A block
may leave a server running in the background (``coordinator serve ... &``): each block runs in a
session of its own, and at the document's end every process left in those sessions is sent
SIGTERM (SIGKILL 30 s later). The one block that needs a PostgreSQL server reads its URL from
``$DATABASE_URL``, which the test sets to a fresh database on the suite's server
(``tests/pgtest.py``). Each block must exit 0 (bash runs with ``-e -u -o pipefail``), and every
relative SSE a block prints must be a number between 0.5 and 100. The README's walkthrough is
examples/federated_walkthrough.sh line for line, and the script runs in its place.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"bash": "bash", "sh": "bash", "python": "python"}
SHOWN = {"text", "console", "json"}
WALKTHROUGH = ROOT / "examples" / "federated_walkthrough.sh"
#: "relative SSE = 1.0013" (evaluate), "relative SSE 1.58" (the README's quickstart), a JSON
#: "relative_sse": 1.2, or simulate's table row "relative SSE vs k-means (n_init = 3) │ 1.0053".
RELATIVE_SSE = re.compile(r"relative[ _]sse(?: vs k-means[^│\n]*│)?\"?\s*[=:]?\s*(-?[0-9.eE+-]+|nan|inf)",
                          re.I)


def fences(doc: Path) -> list[tuple[int, str, str]]:
    """(line of the opening fence, its tag, the block's text) for every fenced block of ``doc``."""
    found, opened, tag, body = [], None, "", []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if opened is None and line.lstrip().startswith("```"):
            opened, tag, body = number, line.strip()[3:].strip(), []
        elif opened is not None and line.strip() == "```":
            found.append((opened, tag, "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{doc.name}: the fence at line {opened} is never closed"
    return found


def runnable(doc: Path) -> list[tuple[int, str, str]]:
    return [(line, RUN[tag], text) for line, tag, text in fences(doc) if tag in RUN]


def test_every_fence_is_tagged():
    untagged = [(doc.name, line, tag) for doc in DOCUMENTS for line, tag, _ in fences(doc)
                if tag not in RUN and tag not in SHOWN]
    assert untagged == []
    assert runnable(ROOT / "README.md"), "the README has no runnable block: the pattern is wrong"


def test_the_checks_catch_an_untagged_fence(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("a\n```\nls\n```\n```bash\necho hi\n```\n")
    assert [tag for _, tag, _ in fences(doc)] == ["", "bash"]
    assert RELATIVE_SSE.findall("SSE/n = 3   relative SSE = 1.0013") == ["1.0013"]
    assert RELATIVE_SSE.findall('{"relative_sse": 1.2}') == ["1.2"]
    assert RELATIVE_SSE.findall("│ relative SSE vs k-means (n_init = 3)   │   nan │") == ["nan"]


def test_json_blocks_parse():
    import json

    for doc in DOCUMENTS:
        for line, tag, text in fences(doc):
            if tag == "json":
                json.loads(text), (doc.name, line)


def walkthrough_body() -> str:
    """examples/federated_walkthrough.sh after its header (shebang, comments, set -e, trap)."""
    return WALKTHROUGH.read_text().split("# the coordinator, if a step failed\n", 1)[1].lstrip("\n")


def test_readme_walkthrough_is_the_example_script():
    """The README's walkthrough is examples/federated_walkthrough.sh after its header, line for
    line; test_document_blocks_run runs the script in its place (header included)."""
    script = WALKTHROUGH.read_text()
    assert any(text == walkthrough_body() for _, _, text in runnable(ROOT / "README.md"))
    assert script.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in script


def stop_sessions(sessions: list[int]) -> None:
    """SIGTERM to every process left in the blocks' sessions, SIGKILL to those that outlive 30 s."""
    def alive(group: int) -> bool:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    for group in filter(alive, sessions):
        os.killpg(group, signal.SIGTERM)
    stop = time.monotonic() + 30
    while any(map(alive, sessions)) and time.monotonic() < stop:
        time.sleep(0.1)
    for group in filter(alive, sessions):
        os.killpg(group, signal.SIGKILL)


#: The longest document (about 100 s of blocks: the operator's walkthroughs); it runs from its
#: own test file, tests/test_doc_blocks_operator.py, so that xdist gives it a worker of its own.
OPERATOR_GUIDE = ROOT / "docs" / "operator-guide.md"


def run_document(doc: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Run every runnable block of ``doc`` in order (module docstring)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("FEDSKETCH_COORDINATOR", "FEDSKETCH_CA", "FEDSKETCH_OPERATOR_TOKEN_FILE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if "$DATABASE_URL" in doc.read_text():
        env["DATABASE_URL"] = request.getfixturevalue("postgres_url")
    work, logs = tmp_path / "work", tmp_path / "logs"
    work.mkdir(), logs.mkdir()
    sessions: list[int] = []
    printed: list[float] = []
    try:
        for line, kind, text in runnable(doc):
            command = (["bash", "-e", "-u", "-o", "pipefail", "-c", text] if kind == "bash"
                       else [sys.executable, "-c", text])
            if text == walkthrough_body():  # the script itself runs: the block and its header
                command = ["bash", str(WALKTHROUGH)]
            # Files, not pipes: a server a block leaves in the background keeps its stdout open.
            out_path, err_path = logs / f"{line}.out", logs / f"{line}.err"
            with out_path.open("w") as out, err_path.open("w") as err:
                proc = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=err,
                                        text=True, start_new_session=True)
                sessions.append(proc.pid)
                proc.wait(timeout=900)
            out, where = out_path.read_text(), f"{doc.name}, the {kind} block at line {line}"
            assert proc.returncode == 0, f"{where} exited {proc.returncode}:\n{out}\n{err_path.read_text()}"
            for value in map(float, RELATIVE_SSE.findall(out)):
                assert math.isfinite(value) and 0.5 < value < 100, (where, value, out)
                printed.append(value)
    finally:
        stop_sessions(sessions)
    if doc.name == "README.md":  # the quickstart's fit and the walkthrough's evaluate
        assert len(printed) >= 2, printed



@pytest.mark.slow
@pytest.mark.parametrize("doc", [d for d in DOCUMENTS if runnable(d) and d != OPERATOR_GUIDE],
                         ids=lambda d: d.name)
def test_document_blocks_run(doc, tmp_path, request):
    run_document(doc, tmp_path, request)


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of ``doc``: lower case, punctuation but '-' dropped,
    spaces to '-'."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in doc.read_text().splitlines() if re.match(r"#+ ", line)}


def test_links_to_sections_resolve():
    """Every link with a #section, in README.md and docs/, names a heading of its target (the
    sections that moved out of the README are re-pointed)."""
    broken = []
    for doc in DOCUMENTS:
        for target, section in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
            path = (doc.parent / target).resolve() if target else doc
            if "://" not in target and path.suffix == ".md" and section not in anchors(path):
                broken.append((doc.name, target, section))
    assert broken == []
    assert "the-coordinators-database-sqlite-or-postgresql" in anchors(ROOT / "docs" / "operator-guide.md")
