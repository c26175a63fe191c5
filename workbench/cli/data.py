"""``workbench data info | check | generate``: a task's data described, checked against its data card, or made by
its generator."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from workbench.cli.flags import _add_plugin_options, _add_threads, _domain_help, _given_options


def _add_data_commands(commands: Any, chosen: dict[str, list[str]] | None) -> None:
    """``workbench data info | check | generate``."""
    data = commands.add_parser("data", help="inspect, check or generate a task's data")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    for action, text in (
        ("info", "describe the data (default: the embedded data)"),
        ("check", "check a dataset against the task's data card"),
    ):
        sub = data_commands.add_parser(action, help=text)
        sub.add_argument("task", metavar="TASK", help=_domain_help().replace(" to adapt to", ""))
        sub.add_argument("--data", required=action == "check", metavar="PATH",
                         help="the data to read" + (" (default: the embedded data)" if action == "info" else ""))
        _add_plugin_options(sub, chosen, "task")
    generate = data_commands.add_parser(
        "generate", help="generate data with the task's generator (real simulators, or known ground truth)"
    )
    generate.add_argument("task", metavar="TASK", help=_domain_help().replace(" to adapt to", ""))
    generate.add_argument("--out", required=True, metavar="DIR", help="output folder")
    generate.add_argument("--seed", type=int, metavar="SEED", help="seed of the generator (default: the task's own)")
    _add_threads(generate)
    _add_plugin_options(generate, chosen, "task", "generate")


def run_data(args: argparse.Namespace) -> int:
    """``workbench data``: what the task's generator wrote (``generate``), or the data's description and skipped
    records (``info``, ``check``); ``check`` exits 1 when a record was skipped."""
    from workbench.core.registry import tasks

    task_cls = tasks.get(args.task)
    if args.data_command == "generate":
        given = _given_options(
            args, {"task": (args.task, task_cls.options), "generate": (args.task, task_cls.generate_options)}
        )
        from workbench.core.options import resolve_options

        task = task_cls(**given["task"])
        what = f"generating data for task '{args.task}'"
        options = resolve_options(what, task_cls.generate_options, given["generate"])
        print(task.generate(Path(args.out), seed=args.seed, **options))
        return 0
    task = task_cls(**_given_options(args, {"task": (args.task, task_cls.options)})["task"])
    print(task.info(args.data))
    print(task.skipped.summary(limit=20))
    if args.data_command == "check":
        if task.skipped:
            print(f"not ok: {task.skipped.headline()} in {args.data}")
            return 1
        print(f"ok: {args.data} matches the data card of task '{args.task}'")
    return 0
