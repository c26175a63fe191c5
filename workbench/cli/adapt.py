"""``workbench adapt``: its flags (the run settings with the chosen task's real defaults, the chosen task's and
method's options), the `workbench.core.config.RunRequest` of a command line, and the run."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from workbench.cli.flags import _add_plugin_options, _add_seal_key, _add_settings, _given_options, _width


def _add_adapt_command(commands: Any, chosen: dict[str, list[str]] | None, examples: str) -> None:
    """``workbench adapt``: the run flags (with the chosen task's real defaults) and the chosen plug-ins' options."""
    task = chosen["task"][0] if chosen and chosen.get("method") else None  # an adapt command naming its task
    defaults = _adapt_defaults(task, chosen["method"][0]) if task else {}
    adapt = commands.add_parser(
        "adapt",
        help="adapt a pretrained model (chosen method + baselines)",
        usage="workbench adapt --domain TASK [--method METHOD] [options]",
        description=_adapt_description(task, defaults),
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run_flags = adapt.add_argument_group("run options" + (f" (defaults: task {task}'s)" if task else ""))
    _add_settings(run_flags, "adapt", defaults)
    run_flags.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    run_flags.add_argument("--quiet", action="store_true", help="print only the result table and the run folder: no "
                           "progress bars, no log lines (warnings still go to stderr)")  # fmt: skip
    _add_seal_key(run_flags)
    _add_plugin_options(adapt, chosen, "task", "method", defaults=defaults.get("options"))


def _adapt_defaults(task: str, method: str) -> dict[str, Any]:
    """What ``workbench adapt --domain task --method method`` would take for every flag left out (`resolve_config`,
    so the help cannot drift from a run): run flag name -> value, and ``options``: kind -> plug-in option values."""
    from workbench.core.config import RunRequest, resolve_config
    from workbench.core.registry import methods, tasks

    config, _ = resolve_config(RunRequest(domain=task, method=method, out="-"))
    task_cls = tasks.get(task)
    learning_rate = config.learning_rate or f"{config.method}'s own, {methods.get(config.method).learning_rate:g}"
    return {
        "method": config.method,
        "baselines": ", ".join(map(str, config.baselines)) or "none",
        "data": f"the embedded data, card {task_cls.card}",
        "model": task_cls.default_model,
        "out": f"runs/{task}-{config.method}-<date>-<time>",
        **{name: getattr(config, name) for name in ("epochs", "batch_size", "patience")},
        **{name: _samples(getattr(config, name), split) for name, split in (("train_size", "training"),
                                                                           ("val_size", "validation"))},  # fmt: skip
        "learning_rate": learning_rate,
        "precision": f"{config.precision}; this task offers {', '.join(task_cls.precisions)}",
        "options": {"task": config.task_options, "method": config.method_options},
    }


#: The sample count a task declares to mean "every sample of the split" (more than any data it reads holds).
EVERY_SAMPLE = 100_000


def _samples(count: int, split: str) -> int | str:
    """A ``--train-size`` / ``--val-size`` default as a run takes it: ``count``, or every sample of the split."""
    return f"every sample of the {split} split" if count >= EVERY_SAMPLE else count


def _adapt_description(task: str | None, defaults: dict[str, Any]) -> str:
    """What ``adapt --help`` says above its flags: how to see a task's options, or the chosen task's methods."""
    if task is None:
        return (
            "Every task and method: workbench list. A task's options, its default method's and the real defaults:\n"
            "  workbench adapt --domain TASK --help\n  workbench adapt --domain TASK --method METHOD --help"
        )
    from workbench.core.config import MethodEntry
    from workbench.core.registry import tasks

    task_cls = tasks.get(task)
    method = defaults["method"]
    others = [name for name in dict.fromkeys([task_cls.default_method, *task_cls.baselines]) if name != method]
    others = [MethodEntry.parse(name).method for name in others]
    lines = [
        f"Task {task}: {task_cls.description}",
        f"Below: the run options, the options of task {task} and those of method {method} (the task's default "
        f"method: {task_cls.default_method}; baselines run beside it: {defaults['baselines']}).",
        f"Other methods of this task: {', '.join(dict.fromkeys(others)) or 'none'}; every method: workbench list.",
        f"A method's options: workbench adapt --domain {task} --method METHOD --help",
    ]
    return "\n".join(textwrap.fill(line, _width(), subsequent_indent="  ") for line in lines)


def adapt_request(args: argparse.Namespace) -> Any:
    """The `workbench.core.config.RunRequest` of a parsed ``adapt`` command line: the run flags given, the task's and
    the method's options."""
    from workbench.core.config import RunRequest
    from workbench.core.registry import methods, tasks

    task_cls = tasks.get(args.domain)
    method_name = (args.method or task_cls.default_method).split(":")[0]  # METHOD[:VARIANT]
    given = {p.name: getattr(args, p.name) for p in RunRequest.parameters() if getattr(args, p.name) is not None}
    options = _given_options(
        args, {"task": (args.domain, task_cls.options), "method": (method_name, methods.get(method_name).options)}
    )
    return RunRequest(**given, task_options=options["task"], method_options=options["method"])


def run_adapt(args: argparse.Namespace) -> int:
    """``workbench adapt``: the run (`workbench.run.adapting.run_request`); with ``--quiet`` only its result table
    and folder are printed, by the first process."""
    from workbench.core.registry import tasks
    from workbench.run.adapting import run_request

    task_cls = tasks.get(args.domain)
    finished = run_request(adapt_request(args), resume=args.resume, quiet=args.quiet)
    from workbench.core.trainer import distributed

    if args.quiet and distributed()[0] == 0:  # quiet: the result only (`run_request` prints it when not quiet)
        from workbench.run import report

        print(report.table(finished.metrics, task_cls.metrics, task_cls.default_method, task_cls.lower_is_better))
        print(f"run written to {finished.path}")
    return 0
