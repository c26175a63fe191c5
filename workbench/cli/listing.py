"""``workbench list``: every registered task, model and method, with their data cards, and the plug-ins that cannot
be loaded with the command that installs what they lack."""

from __future__ import annotations

import argparse
import importlib.util
import textwrap
from typing import Any

from workbench.cli.flags import _width


def _add_list_command(commands: Any) -> None:
    """``workbench list``."""
    commands.add_parser("list", help="registered tasks, models and methods, with their data cards")


def run_list(args: argparse.Namespace) -> int:
    """``workbench list``: `_list` printed."""
    print(_list())
    return 0


def _list() -> str:
    """Every registered task, model and method in aligned columns (names, then descriptions wrapped beside them),
    with data cards; plug-ins that cannot be loaded last, each with the command that installs what it lacks."""
    from workbench.core.datacard import load_card
    from workbench.core.registry import distribution_of, extra_of, install_command, methods, models, tasks
    from workbench.core.registry import missing_distribution as missing_package

    registries = (("tasks", tasks), ("models", models), ("methods", methods))
    entries = {kind: registry.items() for kind, registry in registries}
    names = [name for items in entries.values() for name, _ in items]
    indent = 2 + max(map(len, names), default=0) + 2
    width = max(_width(), indent + 30)

    def row(name: str, *texts: str) -> list[str]:
        """A name in the first column (on a line of its own when it would reach the second), texts beside it."""
        lines = [f"  {name}"] if 2 + len(name) + 2 > indent else []
        for index, text in enumerate(texts):
            first = f"  {name}".ljust(indent) if index == 0 and not lines else " " * indent
            lines += textwrap.wrap(text, width, initial_indent=first, subsequent_indent=" " * (indent + 2),
                                   break_on_hyphens=False)  # a pip command stays whole  # fmt: skip
        return lines

    def card(name: str | None, label: str = "card") -> list[str]:
        return [f"{label}: {name} — {load_card(name).title}"] if name else []

    lines = ["tasks:"]
    for name, cls in entries["tasks"]:
        missing = [package for package in cls.requires if importlib.util.find_spec(package) is None]
        packages = ", ".join(map(distribution_of, missing))
        needs = [f"{packages} not installed: {install_command(cls.extra)}"] if missing else []
        reads = [text for read in cls.reads for text in card(read, "also reads")]
        lines += row(name, cls.description, *needs, *card(cls.card), *reads, f"--precision: {' '.join(cls.precisions)}")
    lines += ["models:"]
    for name, cls in entries["models"]:
        lines += row(name, cls.description, *card(cls.card))
    lines += ["methods:"]
    for name, cls in entries["methods"]:
        lines += row(name, cls.description)
    unavailable = [
        (kind[:-1], name, why, registry.module_of(name))
        for kind, registry in registries
        for name, why in sorted(registry.unavailable.items())
        if name not in registry.names()
    ]
    if unavailable:
        lines += ["not loaded (an optional library is missing or broken):"]
        for kind, name, why, module in unavailable:
            extra, package = extra_of(why, module), missing_package(why)
            lines += row(f"{kind} {name}", f"{package} not installed: {install_command(extra)}" if extra else why)
    return "\n".join(lines)
