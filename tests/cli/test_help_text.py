"""Every command's help reads cleanly at 80 columns (issue 31, item 8): no docstring line break
left inside a paragraph (a line is only ever broken because the next word would not fit) and no
``<bool>`` in the type column of a flag (:mod:`fedsketch.common.helptext`)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from fedsketch.cli import app

WIDTH = 80
ITEM = re.compile(r"\s*([*•-]|\(\d+\)|\d+\.)\s")


def _paths() -> list[list[str]]:
    root = typer.main.get_command(app)
    out, todo = [], [([], root)]
    while todo:
        path, group = todo.pop()
        ctx = group.context_class(group, info_name=" ".join(["fedsketch", *path]))
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            out.append([*path, name])
            if hasattr(command, "list_commands"):
                todo.append(([*path, name], command))
    return out


PATHS = [[]] + _paths()


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "fedsketch")
def test_help_wraps_only_where_the_line_is_full_and_flags_show_no_type(path):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output
    text = res.output.split("╭", 1)[0]  # the description, above the option panels
    lines = [line.rstrip() for line in text.splitlines()]
    for a, b in zip(lines, lines[1:], strict=False):
        if not a.strip() or not b.strip() or ITEM.match(b):
            continue
        # b's first word would have fitted on a: a break a paragraph kept from the docstring
        assert len(a) + 1 + len(b.split()[0]) > WIDTH - 2, f"mid-sentence break:\n{a}\n{b}"
