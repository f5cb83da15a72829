"""Help that reads cleanly: every command group of the command line is a :class:`TidyGroup`.

Typer keeps the single line breaks of a docstring's later paragraphs, so a paragraph written
at 95 columns wraps mid-sentence at 80 ("…of ε / first and the / main sketch…"), and it shows
``<bool>`` in the type column of every on/off flag. A tidy group hands out its commands (and
shows its own help) with each paragraph joined into one line for the terminal to wrap, list
items (lines starting "* ", "- " or "• ") and paragraphs marked ``\\b`` kept as written, and
no type shown for a flag.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from typer.core import TyperGroup

if TYPE_CHECKING:  # typer vendors click; its types only annotate here
    from typer._click import Command, Context

#: A line that starts a list item keeps its line break.
_ITEM = re.compile(r"\s*([*•-]|\(\d+\)|\d+\.)\s")


def reflow(text: str | None) -> str | None:
    """``text`` with the single line breaks inside each paragraph joined (module docstring)."""
    if not text:
        return text
    paragraphs = []
    for paragraph in text.split("\n\n"):
        if paragraph.lstrip().startswith("\b"):
            paragraphs.append(paragraph)
            continue
        lines: list[str] = []
        for line in paragraph.split("\n"):
            if lines and not _ITEM.match(line):
                lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
            else:
                lines.append(line.rstrip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def tidy(command: Command | None, ctx: Context) -> None:
    """Reflow ``command``'s help and hide the type of its flags (its help option's too)."""
    if command is None or getattr(command, "_tidy", False):
        return
    command.help = reflow(command.help)
    help_option = command.get_help_option(ctx)
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    command._tidy = True


class TidyGroup(TyperGroup):
    """A Typer group whose commands and own help are tidied (module docstring)."""

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        tidy(command, ctx)
        return command

    def format_help(self, ctx: Context, formatter) -> None:
        tidy(self, ctx)
        super().format_help(ctx, formatter)
