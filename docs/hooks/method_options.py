"""MkDocs hook: ``<!-- options: NAME -->`` in a page becomes the options of workbench method NAME, read from the code.

What replaces the marker comes from the method's class through the registry (`workbench.core.registry.methods`): its
default learning rate, the model families and model declarations it needs (`workbench.core.model.NEEDS`), what it needs of
the task (`workbench.core.task.CAPABILITIES` and the first line of each protocol's docstring, as the run's refusal says),
and a table of its declared `workbench.core.options.Option`s — flag, type, default, choices and help, with the values that
hold only beside other options' values (`Option.requires`) or that the method declines (`Option.refused`). So a page
says what ``workbench adapt --method NAME --help`` says and cannot drift from it.

A marker naming no registered method, or one whose plug-in cannot be loaded, fails the build with the page and the
marker named (an empty table would pass ``mkdocs build --strict`` silently).

``mkdocs.yml``: ``hooks: [docs/hooks/method_options.py]``.
"""

from __future__ import annotations

import re
from typing import Any

from mkdocs.exceptions import PluginError

from workbench.core.errors import UserError
from workbench.core.model import NEEDS
from workbench.core.options import Option, needs
from workbench.core.registry import methods
from workbench.core.task import CAPABILITIES

#: ``<!-- options: lora -->``; the name is every non-space character up to the comment's end.
MARKER = re.compile(r"<!--\s*options:\s*(?P<name>[^\s>]*)\s*-->")

TYPE_NAMES = {bool: "switch", int: "integer", float: "number", str: "text"}

#: Characters Markdown would read as markup inside a table cell, and what stands for each.
CELL_ESCAPES = {"\\": "\\\\", "|": "\\|", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]", "`": "\\`", "<": "&lt;"}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: every options marker of the page replaced by its method's options."""
    return render_markers(markdown, page.file.src_uri)


def render_markers(markdown: str, page: str) -> str:
    """``markdown`` with every options marker replaced (`options_markdown`); ``page`` names the page in errors."""
    return MARKER.sub(lambda match: options_markdown(match.group("name"), f"{page}: {match.group(0)}"), markdown)


def options_markdown(name: str, where: str = "") -> str:
    """The Markdown that stands for method ``name``'s marker: a list of what it needs, then its options table.

    ``where`` (the page and the marker) opens the `PluginError` raised for a name no plug-in registers or one that
    cannot be loaded.
    """
    if name not in methods.declared():
        raise PluginError(f"{where}: {methods.unknown(name)}; write the method's registered name, as `workbench list`")
    try:
        method = methods.get(name)
    except UserError as error:
        raise PluginError(f"{where}: {error}") from None
    return "\n".join(requirements(method)) + "\n\n" + options_table(method.options) + "\n"


def requirements(method: type) -> list[str]:
    """Bullet lines: the method's default learning rate and what it needs of the model and the task."""
    families = ", ".join(f"`{family}`" for family in method.model_families) or "any"
    lines = [
        f"- **Learning rate** when neither `--lr` nor the task gives one: `{method.learning_rate:g}`",
        f"- **Model families:** {families}",
    ]
    if method.needs_model:
        declared = "; ".join(f"{NEEDS[need]} (`{need}`)" for need in method.needs_model)
        lines.append(f"- **The model must declare:** {declared}")
    if method.needs_task:
        lines.append("- **The task must offer:** " + "; ".join(_task_need(need) for need in method.needs_task))
    return lines


def _task_need(need: Any) -> str:
    """One thing a method needs of a task, in the words its refusal uses."""
    if isinstance(need, str):
        return f"{CAPABILITIES.get(need, need).split(' (')[0]} (`{need}`)"
    what = (need.__doc__ or need.__name__).strip().splitlines()[0].rstrip(".")
    return f"{what[0].lower() + what[1:]} (`{need.__name__}`)"


def options_table(declared: tuple[Option, ...]) -> str:
    """A Markdown table of ``declared``: one row per option, in declaration order."""
    if not declared:
        return "This method takes no options of its own (the run's options apply: `workbench adapt --help`)."
    rows = ["| option | type | default | choices | what it does |", "|---|---|---|---|---|"]
    for option in declared:
        choices = ", ".join(f"`{choice}`" for choice in option.choices or ()) or "–"
        kind = TYPE_NAMES.get(option.type, getattr(option.type, "__name__", str(option.type)))
        rows.append(f"| `{option.flag}` | {kind} | {_default(option)} | {choices} | {_help(declared, option)} |")
    return "\n".join(rows)


def _default(option: Option) -> str:
    if option.type is bool:
        return "off" if not option.default else "on"
    return "(empty)" if option.default == "" else f"`{option.default}`"


def _help(declared: tuple[Option, ...], option: Option) -> str:
    """The option's help, then the values that hold only beside other options' values, those refused, and the
    option's earlier name."""
    parts = [_cell(option.help.rstrip(".")) + "."]
    for value in option.requires:
        said = f"`{option.flag}`" if option.type is bool else f"`{value}`"
        parts.append(f"{said} only with {_cell(needs(declared, option, value))}.")
    for value, why in option.refused.items():
        parts.append(f"`{value}` is not offered: {_cell(why)}.")
    earlier = option.renamed_from
    if earlier is not None and earlier.accepted():
        flag = "--" + earlier.name.replace("_", "-")
        since, until = earlier.since, earlier.removed_in
        parts.append(f"Its earlier name `{flag}` (renamed in {since}) works, with a warning, until {until}.")
    return " ".join(parts)


def _cell(text: str) -> str:
    """``text`` with what Markdown would read as markup, or as a column break, escaped."""
    return "".join(CELL_ESCAPES.get(character, character) for character in text)
