"""The parser of every ``workbench`` command (`build_parser`, each command's flags from its own module) and the
parsing of a command line (`parse`): only the plug-ins it names are imported, and a mistyped task or method is
refused before any of them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from workbench.cli.adapt import _add_adapt_command
from workbench.cli.calibrate import _add_calibrate_command
from workbench.cli.card import _add_card_command
from workbench.cli.compare import _add_compare_command
from workbench.cli.dashboard import _add_dashboard_command
from workbench.cli.data import _add_data_commands
from workbench.cli.evaluate import _add_evaluate_command
from workbench.cli.flags import _OPTION_KINDS
from workbench.cli.listing import _add_list_command
from workbench.cli.predict import _add_predict_command
from workbench.cli.pretrain import _add_pretrain_command
from workbench.cli.serve import _add_serve_commands
from workbench.cli.verify import _add_verify_command

EXAMPLES = """examples (every task: workbench list):
  workbench adapt --domain TASK                           # the task's method + baselines on its embedded data
  workbench adapt --domain TASK --method full --epochs 100 --out runs/full
  workbench adapt --domain TASK --baselines full,METHOD@OTHER_MODEL
  workbench adapt --domain TASK --out runs/x --resume     # continue an interrupted run
  torchrun --nproc_per_node 2 -m workbench adapt --domain TASK --out runs/ddp
  workbench compare --domain TASK --methods A,B,C --folds 3 --seeds 200-202   # grouped folds, paired intervals
  workbench evaluate --run runs/x --data PATH
  workbench data info TASK · workbench data check TASK --data PATH · workbench data generate TASK --out DIR
  workbench predict --run runs/x --input FOLDER --output predictions.csv
  workbench verify runs/x                                 # a run's (or a comparison's) files against their seals
  workbench serve --run runs/x --token-file tokens.txt    # an HTTP service with an audit log (docs/clinical.md)
  workbench audit verify audit-x.jsonl · workbench card runs/x
  workbench list
"""


def _examples(chosen: dict[str, list[str]] | None) -> str:
    """The engine's examples, then the chosen task's own (`workbench.core.task.Task.examples`)."""
    from workbench.core.registry import tasks

    lines = [EXAMPLES.rstrip("\n")]
    for name in (chosen or {}).get("task", []):
        lines += [f"  {example}" for example in tasks.get(name).examples]
    return "\n".join(lines) + "\n"


def _chosen_plugins(argv: Sequence[str]) -> dict[str, list[str]]:
    """The plug-ins a command line names, by kind (``{"task": [...], "method": [...]}``; none when it names no task):
    only their modules are imported, and only their options are offered and shown by ``--help``."""
    from workbench.core.registry import tasks

    argv = list(argv)
    if argv[:1] == ["adapt"]:
        domain = _flag_value(argv, "--domain")
        if domain is None:
            return {}
        task_cls = _named(tasks, domain, "--domain")
        method = (_flag_value(argv, "--method") or task_cls.default_method).split(":")[0]  # METHOD[:VARIANT]
        _check_method_name(task_cls, method)
        return {"task": [domain], "method": [method]}
    if argv[:1] == ["compare"]:
        domain = _flag_value(argv, "--domain") or _rerun_domain(argv)
        return {"task": [domain]} if domain else {}
    if argv[:1] == ["data"] and len(argv) >= 3 and not argv[2].startswith("-"):
        _named(tasks, argv[2], f"workbench data {argv[1]} TASK")
        return {"task": [argv[2]], "generate": [argv[2]] if argv[1] == "generate" else []}
    return {}


def _named(registry: Any, name: str, where: str) -> Any:
    """The plug-in class ``name`` of ``registry``; a name no plug-in declares is refused (with the closest name)
    before any plug-in module is imported, naming ``where`` it was given."""
    from workbench.core.errors import UserError

    if name not in registry.declared():
        raise UserError(f"{where}: {registry.unknown(name)}")
    return registry.get(name)


def _check_method_name(task_cls: Any, method: str) -> None:
    """Refuse a ``--method`` no plug-in declares, offering the closest of the methods that fit the task
    (`_methods_fitting`); a declared method that does not fit is refused by its own ``check`` with the reason."""
    from workbench.core.errors import UserError
    from workbench.core.registry import methods

    if method in methods.declared():
        return
    fitting = _methods_fitting(task_cls)
    said = methods.unknown(method, fitting).replace(
        "; known:", f"; methods of task {task_cls.name} (what each needs of the model is checked when a run starts):"
    )
    raise UserError(f"--method: {said}")


def _methods_fitting(task_cls: Any) -> list[str]:
    """The registered methods whose declarations the task meets (`workbench.core.method.Method.check` without the
    data and model): the model family of the task's default model, the capabilities and protocols the method
    needs of the task. What a method needs of the model itself (``needs_model``) is checked when the run starts."""
    from workbench.core.registry import methods

    task = task_cls()
    fitting = []
    for name, cls in methods.items():
        if cls.model_families and task_cls.default_model not in cls.model_families:
            continue
        if all(need in task_cls.capabilities if isinstance(need, str) else isinstance(task, need)
               for need in cls.needs_task):  # fmt: skip
            fitting.append(name)
    return fitting


def _rerun_domain(argv: Sequence[str]) -> str | None:
    """The task of the comparison that ``compare --rerun-cell ID DIR`` names (its ``DIR/spec.json``); None when the
    command line names none or it cannot be read (`workbench.comparison.rerun.rerun_cell` then says why)."""
    if "--rerun-cell" not in argv[:-2]:
        return None
    folder = argv[list(argv).index("--rerun-cell") + 2]
    try:
        return json.loads((Path(folder) / "spec.json").read_text())["domain"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``), None when absent."""
    for index, word in enumerate(argv):
        if word == flag and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line parsed, importing only the plug-ins it names (`_chosen_plugins`); a flag none of them
    declares is a `UserError` naming them."""
    from workbench.core.errors import UserError

    chosen = _chosen_plugins(argv)
    args, unknown = build_parser(chosen).parse_known_args(argv)
    flags = [word.split("=")[0] for word in unknown if word.startswith("-")]
    if flags and chosen.get("task"):
        kinds = [kind for kind in ("task", "method", "generate") if chosen.get(kind)]
        owners = " or ".join(f"{_OPTION_KINDS[kind][2]} '{chosen[kind][0]}'" for kind in kinds)
        if "method" in kinds:
            where = f"workbench adapt --domain {chosen['task'][0]} --method {chosen['method'][0]} --help"
        else:
            where = f"workbench {' '.join(argv[:3])} --help"
        raise UserError(f"{flags[0]} is not an option of {owners} (their options: {where})")
    if unknown:
        build_parser(chosen).parse_args(argv)  # argparse's own message for anything else
    return args


def build_parser(chosen: dict[str, list[str]] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, with the options of the ``chosen`` plug-ins (`_chosen_plugins`; None: every
    registered plug-in's, for checking documented command lines)."""
    examples = _examples(chosen)
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Adapt pretrained scientific models to your data.",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from workbench import __version__

    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_list_command(commands)
    _add_adapt_command(commands, chosen, examples)
    _add_compare_command(commands, chosen)
    _add_evaluate_command(commands)
    _add_data_commands(commands, chosen)
    _add_predict_command(commands)
    _add_verify_command(commands)
    _add_serve_commands(commands)
    _add_dashboard_command(commands)
    _add_card_command(commands)
    _add_calibrate_command(commands)
    _add_pretrain_command(commands)
    return parser
