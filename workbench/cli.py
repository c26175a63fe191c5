"""The ``workbench`` command: a thin layer that parses options and calls the Python API.

Exit codes: 0 success; 2 bad input (the message names the file, field or option to fix), or a file the disk
refuses (full, read-only, not permitted); 130 interrupted (``adapt`` continues with ``--resume``, ``compare`` with the
same command).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import logging
import shutil
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Sequence

# Engine modules (torch among their imports) are imported where used: a mistyped task or method is refused before.

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
    """The engine's examples, then the chosen task's own (`workbench.task.Task.examples`)."""
    from workbench.registry import tasks

    lines = [EXAMPLES.rstrip("\n")]
    for name in (chosen or {}).get("task", []):
        lines += [f"  {example}" for example in tasks.get(name).examples]
    return "\n".join(lines) + "\n"


#: Where each kind of plug-in option is declared: (registry, class attribute, how messages name its owner).
_OPTION_KINDS = {
    "task": ("tasks", "options", "task"),
    "method": ("methods", "options", "method"),
    "generate": ("tasks", "generate_options", "the data generator of task"),
}


def _metavar(option: Any) -> str | None:
    """What ``--help`` shows after an option's flag: its choices (argparse's ``{a,b}``) or its type."""
    if option.choices is not None:
        return None
    return {int: "INT", float: "FLOAT"}.get(option.type, "TEXT")


#: Every word ``--help`` shows after a flag (`_metavar`, `workbench.settings.Setting.metavar`, each command's own), one
#: small vocabulary:
#: numbers by their type, names by what they name, files by their kind (``tests/test_newcomer_items.py`` holds every
#: option of every command to it).
METAVARS = frozenset({
    "INT", "FLOAT", "TEXT", "SEED", "SEEDS", "RATES",  # numbers (SEEDS: 200,201 or 200-204), free text
    "TASK", "METHOD", "METHODS", "MODEL", "ENTRY", "METRIC", "STAGE", "ID", "A,B[,C]", "METHOD.OPTION=VALUE",  # names
    "PATH", "DIR", "FILE", "RUN", "ADDRESS",  # files and places
    "COMMAND", "ACTION",  # sub-commands
})  # fmt: skip

class _RenamedFlag(argparse.Action):
    """A renamed option's or setting's earlier flag: it sets the current one's value, with a one-line `FutureWarning`
    (`workbench.options.RenamedFrom`); hidden from ``--help``."""

    def __init__(self, option_strings: list[str], dest: str, notice: str, **kwargs: Any):
        self.notice = notice
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        warnings.warn(self.notice, FutureWarning, stacklevel=2)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def _add_renamed_flag(group: Any, declared: Any, dest: str, owner: str) -> bool:
    """The hidden earlier flag of ``declared`` (an option or setting with a ``renamed_from`` still accepted), writing
    into ``dest``; whether one was added."""
    earlier = declared.renamed_from
    if earlier is None or not earlier.accepted():
        return False
    flag = "--" + earlier.name.replace("_", "-")
    notice = f"{owner}{earlier.notice(flag, declared.flag)}"
    if declared.type is bool:
        group.add_argument(flag, dest=dest, action=_RenamedFlag, notice=notice, nargs=0, const=True,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fmt: skip
    else:
        group.add_argument(flag, dest=dest, action=_RenamedFlag, notice=notice, type=declared.type,
                           choices=declared.choices, metavar=None if declared.choices else _metavar(declared),
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fmt: skip
    return True


def _add_settings(group: Any, command: str, shown: dict[str, Any] | None = None) -> None:
    """The flags of the run settings ``command`` takes (`workbench.settings.settings_for`), each with its declared
    help and default (``shown``: setting name -> the value the chosen task gives it, said instead), and the hidden
    earlier flag of a renamed one."""
    from workbench.settings import settings_for

    for setting in settings_for(command):
        if setting.type is bool:
            group.add_argument(setting.flag, dest=setting.name, action="store_true", help=setting.help)
            _add_renamed_flag(group, setting, setting.name, "")
            continue
        text = _domain_help() if setting.name == "domain" else setting.help
        if setting.name in (shown or {}):
            text = _with_default(_without_default(text), shown[setting.name])
        elif not setting.required:
            text = _with_default(text, "the task's" if setting.default is None else setting.default)
        metavar = None if setting.choices else setting.metavar or _metavar(setting)
        group.add_argument(setting.flag, dest=setting.name, type=setting.type, choices=setting.choices,
                           default=setting.default, required=setting.required, metavar=metavar,
                           help=text)  # fmt: skip
        _add_renamed_flag(group, setting, setting.name, "")


def _domain_help() -> str:
    """What ``--domain`` takes, its choices read from the entry points (no plug-in imported)."""
    from workbench.registry import tasks

    names = ", ".join(tasks.declared())
    return f"the domain to adapt to (its data set and problem): {names}; `workbench list` describes each"


def _with_default(text: str, default: Any) -> str:
    """An option's help with its default appended, unless the text already says it or there is none to say."""
    if "(default" in text or default is None or default == "" or default is False:
        return text
    return f"{text} (default: {default})"


def _add_plugin_options(
    parser: argparse.ArgumentParser,
    chosen: dict[str, list[str]] | None,
    *kinds: str,
    defaults: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One group per chosen plug-in of ``kinds`` (None: every registered one), each option with the plug-in's own
    text and default (``defaults``: kind -> the values a run would take, `_adapt_defaults`). A name a second plug-in
    also declares keeps the first one's flag; which plug-in takes it is decided when parsing (`_given_options`)."""
    from workbench import registry
    from workbench.options import conditions, offered

    added: dict[str, str] = {}
    renamed: list[tuple[Any, Any, str]] = []  # (group, option, owner): earlier flags, added once every name is known
    for kind in kinds:
        plugins, attribute, label = _OPTION_KINDS[kind]
        known = getattr(registry, plugins)
        pairs = known.items() if chosen is None else [(name, known.get(name)) for name in chosen.get(kind, [])]
        for name, cls in pairs:
            declared = getattr(cls, attribute)
            if not declared:
                continue
            group = parser.add_argument_group(f"options of {label} {name}")
            values = {o.name: (defaults or {}).get(kind, {}).get(o.name, o.default) for o in declared}
            for option in declared:
                if option.name in added:
                    continue  # e.g. a task and its method declaring one name: said once, set in Python
                added[option.name] = f"{label} {name}"
                renamed.append((group, option, f"{label} {name}: "))
                text = _with_default(option.help, values[option.name])
                if conditions(declared, option, values):
                    text += f" ({'; '.join(conditions(declared, option, values))})"
                if option.type is bool:  # a switch: present means True
                    group.add_argument(option.flag, dest=f"opt_{option.name}", action="store_const", const=True,
                                       help=text)  # fmt: skip
                else:  # what holds beside the defaults is listed; the rest parses and `resolve_options` says why not
                    shown = offered(option, values)
                    choices = None if option.choices is None else [*option.choices, *option.refused]
                    metavar = "{" + ",".join(map(str, shown)) + "}" if choices and shown != choices else None
                    group.add_argument(option.flag, dest=f"opt_{option.name}", type=option.type, choices=choices,
                                       metavar=metavar or _metavar(option), help=text)  # fmt: skip
    for group, option, owner in renamed:  # an earlier name another chosen plug-in declares now stays that one's
        if option.renamed_from and option.renamed_from.name not in added:
            if _add_renamed_flag(group, option, f"opt_{option.name}", owner):
                added[option.renamed_from.name] = owner


def _given_options(args: argparse.Namespace, owners: dict[str, tuple[str, Sequence[Any]]]) -> dict[str, dict]:
    """The plug-in options given on the command line, split by kind: ``owners`` maps each kind to the chosen
    plug-in's (name, declared options). A flag no chosen plug-in declares, or two declare, is a `UserError`."""
    from workbench.errors import UserError

    given = {key[4:]: value for key, value in vars(args).items() if key.startswith("opt_") and value is not None}
    split: dict[str, dict] = {kind: {} for kind in owners}
    label = {kind: text for kind, (_, _, text) in _OPTION_KINDS.items()}
    for name, value in given.items():
        takers = [kind for kind, (_, declared) in owners.items() if name in {o.name for o in declared}]
        flag = "--" + name.replace("_", "-")
        if not takers:
            chosen = " or ".join(f"{label[kind]} '{owner}'" for kind, (owner, _) in owners.items())
            raise UserError(f"{flag} is not an option of {chosen}")
        if len(takers) > 1:
            both = " and ".join(f"{label[kind]} '{owners[kind][0]}'" for kind in takers)
            raise UserError(f"{flag} is an option of both {both}; set it in Python (task_options / method_options)")
        split[takers[0]][name] = value
    return split


def _chosen_plugins(argv: Sequence[str]) -> dict[str, list[str]]:
    """The plug-ins a command line names, by kind (``{"task": [...], "method": [...]}``; none when it names no task):
    only their modules are imported, and only their options are offered and shown by ``--help``."""
    from workbench.registry import tasks

    argv = list(argv)
    if argv[:1] == ["adapt"]:
        domain = _flag_value(argv, "--domain")
        if domain is None:
            return {}
        task_cls = _named(tasks, domain, "--domain")
        method = _flag_value(argv, "--method") or task_cls.default_method
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
    from workbench.errors import UserError

    if name not in registry.declared():
        raise UserError(f"{where}: {registry.unknown(name)}")
    return registry.get(name)


def _check_method_name(task_cls: Any, method: str) -> None:
    """Refuse a ``--method`` no plug-in declares, offering the closest of the methods that fit the task
    (`_methods_fitting`); a declared method that does not fit is refused by its own ``check`` with the reason."""
    from workbench.errors import UserError
    from workbench.registry import methods

    if method in methods.declared():
        return
    fitting = _methods_fitting(task_cls)
    said = methods.unknown(method, fitting).replace(
        "; known:", f"; methods of task {task_cls.name} (what each needs of the model is checked when a run starts):"
    )
    raise UserError(f"--method: {said}")


def _methods_fitting(task_cls: Any) -> list[str]:
    """The registered methods whose declarations the task meets (`workbench.method.Method.check` without the
    data and model): the model family of the task's default model, the capabilities and protocols the method
    needs of the task. What a method needs of the model itself (``needs_model``) is checked when the run starts."""
    from workbench.registry import methods

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
    command line names none or it cannot be read (`workbench.comparison.rerun_cell` then says why)."""
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
    from workbench.errors import UserError

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
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("list", help="registered tasks, models and methods, with their data cards")

    _add_adapt_command(commands, chosen, examples)
    _add_compare_command(commands, chosen)

    evaluate = commands.add_parser("evaluate", help="re-score a finished run on other data")
    evaluate.add_argument("run_folder", nargs="?", metavar="RUN", help="run directory (or --run RUN)")
    evaluate.add_argument("--run", metavar="RUN", help="run directory")
    evaluate.add_argument("--data", metavar="PATH", help="data to score on (default: the run's own); its test split "
                          "is used")  # fmt: skip
    _add_settings(evaluate, "evaluate")
    _add_trust_modified(evaluate)

    _add_data_commands(commands, chosen)

    predict = commands.add_parser("predict", help="score every record of a folder with a finished run's model")
    predict.add_argument("--run", required=True, metavar="RUN", help="run directory (from workbench adapt)")
    predict.add_argument("--input", required=True, metavar="DIR",
                         help="folder of inputs (records, files: what the run's task reads)")  # fmt: skip
    predict.add_argument("--output", required=True, metavar="FILE", help="CSV to write (a .json with hashes is "
                         "written beside it); never inside a run folder")  # fmt: skip
    predict.add_argument("--overwrite", action="store_true", help="replace an earlier CSV and record at --output")
    _add_trust_modified(predict)
    _add_threads(predict)
    _add_device(predict)

    verify = commands.add_parser("verify", help="check a run's or a comparison's files against their seals")
    verify.add_argument("folder", metavar="DIR", help="a run (workbench adapt --out) or comparison folder")
    _add_service_commands(commands)

    pretrain = commands.add_parser("pretrain", help="train the task's shipped foundation model from scratch")
    pretrain.add_argument("--domain", required=True, metavar="TASK", help=_domain_help().replace(" to adapt to", ""))
    pretrain.add_argument("--out", required=True, metavar="FILE", help="checkpoint path (.safetensors)")
    pretrain.add_argument("--epochs", type=int, default=100, metavar="INT", help="training epochs (default: 100)")
    pretrain.add_argument("--seed", type=int, default=0, metavar="SEED", help="seeds initialisation and shuffling "
                          "(default: 0)")  # fmt: skip
    _add_device(pretrain)
    pretrain.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    pretrain.add_argument("--stage", metavar="STAGE",
                          help="what to make, for tasks that pretrain in stages (default: the model)")  # fmt: skip
    _add_threads(pretrain)
    return parser

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
    _add_plugin_options(adapt, chosen, "task", "method", defaults=defaults.get("options"))


#: ``compare --help``'s examples (placeholders: TASK, methods A, B, C; each parses, tests/test_compare_defaults.py).
COMPARE_EXAMPLES = """examples:
  workbench compare --domain TASK --methods A,B                # default design: 3 folds × seeds 200-202
  workbench compare --domain TASK --methods A,B --learner B    # A does not move from the base model: B shows training
  workbench compare --domain TASK --methods A,B,C --folds 5 --seeds 200-204 --workers 2
  workbench compare --domain TASK --methods A,B --budget convergence --lr-grid 3e-4,1e-3,3e-3
  workbench compare --domain TASK --methods A,B --plan --sd 0.02 --effect 0.03   # the seeds a difference needs
"""


def _add_compare_command(commands: Any, chosen: dict[str, list[str]] | None) -> None:
    """``workbench compare``: its flags (`workbench.comparison.CompareSpec`, whose defaults they show and take) and
    the chosen task's options."""
    from workbench.comparison import BUDGETS, DEVELOPMENT_SEEDS_BELOW, EXECUTORS, FIRST_REPORTED_SEED, CompareSpec
    from workbench.statistics import MIN_UNITS

    spec = {f.name: f.default for f in dataclasses.fields(CompareSpec) if f.default is not dataclasses.MISSING}
    seeds = _seeds_text(spec["seeds"])
    description = (
        "Every method on the same grouped folds (each group tested once per seed) and seeds, at one budget; "
        "report.md gives mean ± sd and the paired difference to the reference over seeds (the folds of a seed "
        f"averaged): a 95 % t interval, a Holm-adjusted p and the minimum detectable difference; no verdict below "
        f"{MIN_UNITS} seeds. The default design, {spec['folds']} folds × seeds {seeds}, can reach one; it is printed "
        f"before any cell runs. --plan sizes a comparison before running it. Seeds below {DEVELOPMENT_SEEDS_BELOW} are "
        f"for development, {DEVELOPMENT_SEEDS_BELOW}–{FIRST_REPORTED_SEED - 1} were spent on earlier reports: report "
        f"seeds from {FIRST_REPORTED_SEED} on. Re-running the same command continues an "
        "interrupted comparison."
    )
    compare = commands.add_parser(
        "compare",
        help="compare methods on grouped folds and seeds, with paired intervals",
        usage="workbench compare --domain TASK --methods A,B[,C] [options]\n"
        "       workbench compare --rerun-cell ID DIR",
        description=textwrap.fill(description, _width()),
        epilog=COMPARE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flags = compare.add_argument_group("comparison options")
    flags.add_argument("--domain", metavar="TASK", help=_domain_help().replace(" to adapt to", " to compare on")
                       + " (required, unless --rerun-cell)")  # fmt: skip
    flags.add_argument("--methods", metavar="A,B[,C]", help="comma-separated METHOD[@MODEL][:VARIANT] (a VARIANT's "
                       "options: --set; required, unless --rerun-cell)")  # fmt: skip
    flags.add_argument("--reference", metavar="ENTRY",
                       help="the method the others are paired against (default: the first)")  # fmt: skip
    flags.add_argument("--learner", metavar="ENTRY", help="the entry whose after − before shows that the cells train "
                       "(default: the reference; name another when the reference is a source-only "
                       "baseline)")  # fmt: skip
    flags.add_argument("--folds", type=int, default=spec["folds"], metavar="INT",
                       help=_with_default("grouped folds per seed", spec["folds"]))  # fmt: skip
    flags.add_argument("--seeds", default=seeds, metavar="SEEDS", help=_with_default(
        f"seeds: 200,201 or 200-204; a verdict needs at least {MIN_UNITS}", seeds))  # fmt: skip
    flags.add_argument("--budget", default=spec["budget"], choices=BUDGETS, help=_with_default(
        "steps: same epochs, no early stopping; convergence: same early-stopping rule", spec["budget"]))  # fmt: skip
    flags.add_argument("--fold-val-share", type=float, default=spec["val_share"], metavar="FLOAT", help=_with_default(
        "share of a fold's non-test groups that validates", spec["val_share"]))  # fmt: skip
    flags.add_argument("--lr-grid", metavar="RATES", help="learning rates each method chooses from per cell on the "
                       "validation objective (--select-on) (default: none, --lr or each method's own)")  # fmt: skip
    flags.add_argument("--set", action="append", default=[], metavar="METHOD.OPTION=VALUE",
                       help="an option of one compared entry (repeatable): METHOD:VARIANT.OPTION=VALUE (default: "
                       "each method's own options)")  # fmt: skip
    flags.add_argument("--out", metavar="DIR", help="output folder (default: runs/compare-<task>-<time>)")
    flags.add_argument("--rerun-cell", nargs=2, metavar=("ID", "DIR"),
                       help="run the recorded cell ID (METHOD/foldK-seedS) of the comparison in DIR again in a "
                       "temporary folder; exit 1 when its metrics or manifest hashes differ")  # fmt: skip
    flags.add_argument("--workers", type=int, default=1, metavar="INT",
                       help="cells at a time (default: 1, in this process)")  # fmt: skip
    flags.add_argument("--threads", type=int, default=1, metavar="INT",
                       help="CPU threads per cell, fixed so that reruns agree bit for bit (default: 1)")  # fmt: skip
    flags.add_argument("--executor", default="local", choices=EXECUTORS,
                       help="local processes, or a Dask cluster (pip extra 'cluster') (default: local)")  # fmt: skip
    flags.add_argument("--scheduler", metavar="ADDRESS",
                       help="address of a running Dask scheduler (default: a local Dask cluster)")  # fmt: skip
    flags.add_argument("--cell-reports", action="store_true",
                       help="each cell's run writes its own report.md and plots (default: only the comparison's)")
    flags.add_argument("--no-share", action="store_true",
                       help="every cell reads, loads, prepares and scores its base model itself instead of once per "
                       "seed or (fold, seed) and worker: the same numbers, slower (a check)")  # fmt: skip
    flags.add_argument("--side-by-side", action="store_true",
                       help="train the seeds of each method and fold as one batched computation where the method "
                       "and model allow it (metrics equal one seed at a time to rounding; each cell records how it "
                       "trained)")  # fmt: skip
    flags.add_argument("--quiet", action="store_true", help="no design, progress bar or table (warnings stay)")
    _add_settings(compare.add_argument_group("run options (every cell's, as workbench adapt takes them)"), "compare")
    power = compare.add_argument_group("planning (no cell is run)")
    power.add_argument("--plan", action="store_true", help="print the design, the minimum detectable difference of "
                       "the planned seeds (80 %% power) and, with --effect, the seeds needed; run nothing")  # fmt: skip
    power.add_argument("--sd", type=float, metavar="FLOAT", help="standard deviation of one seed's mean paired "
                       "difference (--plan needs it or --pilot)")  # fmt: skip
    power.add_argument("--pilot", metavar="DIR",
                       help="a finished comparison folder whose seeds give that standard deviation")  # fmt: skip
    power.add_argument("--effect", type=float, metavar="FLOAT", help="the difference to detect: how many seeds it "
                       "needs (default: none, the MDD only)")  # fmt: skip
    _add_plugin_options(compare, chosen, "task")


def _seeds_text(seeds: Sequence[int]) -> str:
    """``--seeds`` as a command line gives them: FIRST-LAST for consecutive seeds, else comma-separated."""
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _compare_spec(args: argparse.Namespace) -> Any:
    """The `workbench.comparison.CompareSpec` of a ``compare`` command line."""
    from workbench.comparison import CompareSpec, entry_of
    from workbench.errors import UserError
    from workbench.options import renamed
    from workbench.registry import methods, tasks
    from workbench.settings import settings_for

    if args.domain is None or args.methods is None:
        raise UserError("compare needs --domain and --methods (or --rerun-cell ID DIR to run a recorded cell again)")

    def numbers(text: str, kind: Any, flag: str) -> tuple:
        try:
            if kind is int and "-" in text.strip("-") and "," not in text:
                first, last = (int(part) for part in text.split("-"))
                return tuple(range(first, last + 1))
            return tuple(kind(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise UserError(f"{flag} takes comma-separated numbers{' or FIRST-LAST' if kind is int else ''}, got "
                            f"{text!r}") from None  # fmt: skip

    method_names = tuple(name for name in args.methods.split(",") if name)
    method_options: dict[str, dict[str, Any]] = {}
    for text in args.set:
        target, equals, value = text.partition("=")
        label, dot, option = target.rpartition(".")
        if not (equals and dot and label and option):
            raise UserError(f"--set takes METHOD.OPTION=VALUE (METHOD as --methods names it), got {text!r}")
        method = entry_of(label).method
        declared = {o.name: o for o in methods.get(method).options}
        name = option.replace("-", "_")
        [name] = renamed(f"--set {text}: method '{method}'", declared.values(), {name: None})  # an earlier name: now
        if name not in declared:
            raise UserError(f"--set {text}: method '{method}' has no option {name} (it takes {sorted(declared)})")
        kind = declared[name].type
        method_options.setdefault(label, {})[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(
            value)  # fmt: skip
    task_cls = tasks.get(args.domain)
    options = _given_options(args, {"task": (args.domain, task_cls.options)})["task"]
    return CompareSpec(
        domain=args.domain, methods=method_names, reference=args.reference or "", learner=args.learner or "",
        folds=args.folds, seeds=numbers(args.seeds, int, "--seeds"), budget=args.budget,
        lr_grid=numbers(args.lr_grid, float, "--lr-grid") if args.lr_grid else (), val_share=args.fold_val_share,
        task_options=options, method_options=method_options,
        **{setting.name: getattr(args, setting.name) for setting in settings_for("compare")},
    )  # fmt: skip


def _rerun_cell(cell_name: str, folder: str) -> int:
    """``compare --rerun-cell ID DIR``: the cell's recorded and rerun metrics with their absolute differences, and
    whether its configuration hash and data fingerprint match its manifest; 0 when all do, else 1."""
    from workbench.comparison import RERUN_TOLERANCE, rerun_cell

    result = rerun_cell(folder, cell_name)
    print(f"cell {cell_name} of {folder}, rerun with {result['threads']} thread(s)")
    print(f"{'metric':28}{'recorded':>20}{'rerun':>20}{'|difference|':>14}")
    for name, difference in result["differences"].items():
        values = [str(result[side].get(name, "-")) for side in ("recorded", "rerun")]
        print(f"{name:28}{values[0]:>20}{values[1]:>20}{'-' if difference is None else f'{difference:.3g}':>14}")
    said = {True: "match", False: "DIFFER", None: "not recorded (a record without a manifest)"}
    for key, entry in result["hashes"].items():
        shown = f" (recorded {entry['recorded']}, rerun {entry['rerun']})" if entry["match"] is False else ""
        print(f"{key}: {said[entry['match']]}{shown}")
    if result["changed"]:
        print(f"changed since the record: {', '.join(result['changed'])}")
    if result["matches"]:
        print(f"ok: cell {cell_name} reproduces its recorded metrics (within {RERUN_TOLERANCE:g}) and hashes")
        return 0
    reasons = []
    if result["mismatched"]:
        reasons.append(f"metric(s) {', '.join(result['mismatched'])} differ by more than {RERUN_TOLERANCE:g}")
    reasons += [
        f"its {key.replace('_', ' ')} differs from the recorded one (the {what} changed: the likely reason)"
        for key, what in (("config_hash", "configuration"), ("data_fingerprint", "data"))
        if result["hashes"][key]["match"] is False
    ]
    print(f"not ok: cell {cell_name} of {folder} does not reproduce: {'; '.join(reasons)}")
    return 1


def _plan(args: argparse.Namespace) -> None:
    """``compare --plan``: the planned comparison's minimum detectable difference and the seeds an ``--effect``
    needs, from ``--sd`` or a ``--pilot`` comparison folder (`workbench.comparison_report.plan`); runs no cell."""
    from workbench.comparison_report import plan
    from workbench.errors import UserError

    spec = _compare_spec(args)
    spec.check()
    if args.sd is None and args.pilot is None:
        raise UserError("--plan needs --sd (the sd of one seed's mean paired difference) or --pilot DIR")
    if args.sd is not None and not args.sd >= 0:
        raise UserError(f"--sd must be a standard deviation (0 or more), got {args.sd}")
    if args.effect is not None and not args.effect > 0:
        raise UserError(f"--effect must be a positive difference, got {args.effect}")
    pilot = None
    if args.pilot is not None:
        path = Path(args.pilot) / "comparison.json"
        try:
            pilot = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise UserError(f"--pilot {args.pilot}: cannot read {path} ({error}); give a finished comparison folder")
        try:
            paired = [m.get("vs_reference") for entry in pilot["summary"].values() for m in entry["metrics"].values()]
        except (KeyError, TypeError, AttributeError) as error:
            raise UserError(f"--pilot {args.pilot}: {path} is damaged (no comparison's summary: "
                            f"{type(error).__name__} {error}); give a finished comparison") from None  # fmt: skip
        if any(p is not None and "unit_sd" not in p for p in paired):
            raise UserError(f"--pilot {args.pilot}: {path} was written before seed-level statistics; rerun "
                            "`workbench compare` on that folder to rewrite it")  # fmt: skip
    print(plan(spec, sd=args.sd, effect=args.effect, pilot=pilot))


def _add_service_commands(commands: Any) -> None:
    """``serve`` (a finished run over HTTP), ``audit verify`` (its log's hash chain) and ``card`` (a model card)."""
    from workbench.serve.limits import Limits

    default = Limits()
    serve = commands.add_parser("serve", help="answer records over HTTP with a finished run's model, with an audit "
                                "log (needs the serve extra)")  # fmt: skip
    serve.add_argument("--run", required=True, metavar="RUN", help="run directory (from workbench adapt)")
    serve.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address to listen on (default: "
                       "127.0.0.1; elsewhere put a TLS proxy in front)")  # fmt: skip
    serve.add_argument("--port", type=int, default=8000, metavar="INT", help="port (default: 8000)")
    serve.add_argument("--intake", metavar="DIR", help="folder whose records JSON requests may name by a relative "
                       "path (default: uploads only)")  # fmt: skip
    serve.add_argument("--token-file", metavar="FILE", help="lines 'caller_id token' (default: the environment "
                       "variable WORKBENCH_SERVE_TOKENS)")  # fmt: skip
    serve.add_argument("--audit-log", metavar="FILE", help="hash-chained JSON-lines log, one line per request; an "
                       "existing one is verified and continued (default: audit-<run name>.jsonl here)")  # fmt: skip
    serve.add_argument("--max-request-mb", type=float, default=default.max_request_bytes / 2**20, metavar="FLOAT",
                       help=f"largest request body [MiB] (default: {default.max_request_bytes / 2**20:g})")  # fmt: skip
    serve.add_argument("--max-record-s", type=float, default=default.max_record_seconds, metavar="FLOAT",
                       help=f"longest signal record [s] (default: {default.max_record_seconds:g})")  # fmt: skip
    serve.add_argument("--max-pixels", type=int, default=default.max_pixels, metavar="INT",
                       help=f"largest image, told by its header (default: {default.max_pixels})")  # fmt: skip
    serve.add_argument("--timeout-s", type=float, default=default.timeout_s, metavar="FLOAT",
                       help=f"time to answer one request [s], else 504 (default: {default.timeout_s:g})")  # fmt: skip
    _add_trust_modified(serve)
    _add_threads(serve)
    _add_device(serve)

    audit = commands.add_parser("audit", help="check a served model's audit log")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    audit_verify = audit_commands.add_parser("verify", help="check every line's hash and the chain between lines")
    audit_verify.add_argument("log", metavar="FILE", help="the log workbench serve --audit-log wrote")

    card = commands.add_parser("card", help="write a model card (Markdown) from a finished run")
    card.add_argument("run_folder", metavar="RUN", help="run directory (from workbench adapt)")
    card.add_argument("--output", metavar="FILE", help="where to write it, outside the run folder (default: "
                      "card-<run name>.md here)")  # fmt: skip
    card.add_argument("--overwrite", action="store_true", help="replace an earlier card at --output")


def _serve(args: argparse.Namespace) -> int:
    """``workbench serve``: the limits from the flags, then `workbench.serve.server.serve` until SIGTERM."""
    from workbench.errors import UserError
    from workbench.serve.limits import Limits

    for flag, value in (("--max-request-mb", args.max_request_mb), ("--max-record-s", args.max_record_s),
                        ("--max-pixels", args.max_pixels), ("--timeout-s", args.timeout_s)):  # fmt: skip
        if not value > 0:
            raise UserError(f"{flag} {value}: expected a positive number")
    if not 0 <= args.port < 65536:
        raise UserError(f"--port {args.port}: expected 0-65535")
    try:
        from workbench.serve.server import serve
    except ImportError as error:
        raise UserError(f"workbench serve needs the serve extra ({error}): pip install -e \".[serve]\"") from None
    limits = Limits(max_request_bytes=int(args.max_request_mb * 2**20), max_record_seconds=args.max_record_s,
                    max_pixels=args.max_pixels, timeout_s=args.timeout_s)  # fmt: skip
    serve(args.run, host=args.host, port=args.port, intake=args.intake, token_file=args.token_file,
          audit_log=args.audit_log, limits=limits, trust_modified=args.trust_modified, device=args.device)  # fmt: skip
    return 0


def _audit_verify(log: str) -> int:
    """``workbench audit verify LOG``: 0 and a one-line summary when every line is intact; else 1, naming the first
    bad line on stderr."""
    from workbench.serve.audit import verify_log

    check = verify_log(log)
    if not check.ok:
        print(f"workbench: error: {check.summary()}", file=sys.stderr)
        return 1
    print(check.summary())
    return 0


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


def _without_default(text: str) -> str:
    """A run flag's help without its "(default: ...)" remark (nested brackets included), for a stated value."""
    start = text.find(" (default")
    if start < 0:
        return text
    depth, end = 0, start + 1
    for end in range(start + 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    return text[:start] + text[end + 1 :]


def _adapt_defaults(task: str, method: str) -> dict[str, Any]:
    """What ``workbench adapt --domain task --method method`` would take for every flag left out (`resolve_config`,
    so the help cannot drift from a run): run flag name -> value, and ``options``: kind -> plug-in option values."""
    from workbench.config import RunRequest, resolve_config
    from workbench.registry import methods, tasks

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
    from workbench.config import MethodEntry
    from workbench.registry import tasks

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


def _width() -> int:
    """Columns to wrap help and listings to: the terminal's (80 when not a terminal), as argparse does."""
    return shutil.get_terminal_size().columns - 2


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, metavar="INT",
                        help="CPU threads (default: chosen at start, see workbench.threads)")  # fmt: skip


def _add_device(parser: argparse.ArgumentParser) -> None:
    """``--device`` of the commands outside the run settings (`workbench.settings.SETTINGS` declares adapt's)."""
    from workbench.device import DEVICES

    parser.add_argument("--device", default="auto", choices=DEVICES, help="where to compute (default: auto: cuda "
                        "where torch sees a CUDA device, else cpu)")  # fmt: skip


def _add_trust_modified(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-modified", action="store_true", help="use a run whose files differ from its "
                        "seal.json (changed after it finished); the output records it")  # fmt: skip


def _verify(folder: str) -> int:
    """``workbench verify DIR``: 0 and "ok: N files verified" when every sealed file below ``DIR`` matches its seal
    and every finished run, cell and comparison there has one; else 2, naming each bad file on stderr."""
    from workbench.errors import UserError
    from workbench.seal import SEAL, verify

    path = Path(folder)
    if not path.is_dir():
        raise UserError(f"{path}: no such folder (give a run or comparison folder)")
    result = verify(path)
    if not (result.checked or result.problems or result.unsealed):
        raise UserError(f"{path}: not a finished run or comparison (no {SEAL}, no metrics.json or comparison.json)")
    for extra in result.extra:
        print(f"not sealed (added after sealing; not checked): {extra}")
    for problem in result.problems:
        print(f"workbench: error: {problem}", file=sys.stderr)
    for unsealed in result.unsealed:
        print(f"workbench: error: {unsealed}: no {SEAL} (written before runs were sealed): cannot be verified",
              file=sys.stderr)  # fmt: skip
    if not result.ok:
        return 2
    print(f"ok: {result.checked} files verified in {path}")
    return 0



def _list() -> str:
    """Every registered task, model and method in aligned columns (names, then descriptions wrapped beside them),
    with data cards; plug-ins that cannot be loaded last, each with the command that installs what it lacks."""
    from workbench.datacard import load_card
    from workbench.registry import distribution_of, extra_of, install_command, methods, models, tasks
    from workbench.registry import missing_distribution as missing_package

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


def _quiet_console() -> None:
    """``--quiet``: log records below WARNING stay off the terminal. The workbench's loggers set their own level (a
    run copies INFO into its log.txt), so the console handlers' level is raised, not only the root logger's."""
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for handler in root.handlers:
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout):
            handler.setLevel(logging.WARNING)


def adapt_request(args: argparse.Namespace) -> Any:
    """The `workbench.config.RunRequest` of a parsed ``adapt`` command line: the run flags given, the task's and the
    method's options."""
    from workbench.config import RunRequest
    from workbench.registry import methods, tasks

    task_cls = tasks.get(args.domain)
    method_name = args.method or task_cls.default_method
    given = {p.name: getattr(args, p.name) for p in RunRequest.parameters() if getattr(args, p.name) is not None}
    options = _given_options(
        args, {"task": (args.domain, task_cls.options), "method": (method_name, methods.get(method_name).options)}
    )
    return RunRequest(**given, task_options=options["task"], method_options=options["method"])


def run(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if getattr(args, "quiet", False):
        _quiet_console()
    from workbench.registry import tasks
    from workbench.threads import use_threads

    if args.command != "adapt" and hasattr(args, "threads"):  # adapt chooses its own (and keeps it on --resume)
        use_threads(args.threads)

    if args.command == "list":
        print(_list())
    elif args.command == "adapt":
        from workbench.run import run_request

        task_cls = tasks.get(args.domain)
        finished = run_request(adapt_request(args), resume=args.resume, quiet=args.quiet)
        from workbench.trainer import distributed

        if args.quiet and distributed()[0] == 0:  # quiet: the result only (`run_request` prints it when not quiet)
            from workbench import report

            print(report.table(finished.metrics, task_cls.metrics, task_cls.default_method, task_cls.lower_is_better))
            print(f"run written to {finished.path}")
    elif args.command == "compare" and args.rerun_cell:
        return _rerun_cell(*args.rerun_cell)
    elif args.command == "compare" and args.plan:
        _plan(args)
    elif args.command == "compare":
        from datetime import datetime

        from workbench.comparison import compare

        out = args.out or f"runs/compare-{args.domain}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        compare(_compare_spec(args), out, workers=args.workers, threads=args.threads, executor=args.executor,
                scheduler=args.scheduler, quiet=args.quiet, cell_reports=args.cell_reports,
                share=not args.no_share, side_by_side=args.side_by_side)  # fmt: skip
    elif args.command == "evaluate":
        from workbench.errors import UserError
        from workbench.run import evaluate_run

        if (args.run is None) == (args.run_folder is None):
            raise UserError("evaluate needs one run: workbench evaluate RUN (or --run RUN)")
        run_folder = args.run or args.run_folder
        metrics, sealed = evaluate_run(run_folder, data=args.data, device=args.device,
                                       trust_modified=args.trust_modified)  # fmt: skip
        print(_seal_line(run_folder, sealed))
        print("\n".join(f"{name:28}{value:12.3f}" for name, value in metrics.items()))
    elif args.command == "data":
        task_cls = tasks.get(args.task)
        if args.data_command == "generate":
            given = _given_options(
                args, {"task": (args.task, task_cls.options), "generate": (args.task, task_cls.generate_options)}
            )
            from workbench.options import resolve_options

            task = task_cls(**given["task"])
            what = f"generating data for task '{args.task}'"
            options = resolve_options(what, task_cls.generate_options, given["generate"])
            print(task.generate(Path(args.out), seed=args.seed, **options))
        else:
            task = task_cls(**_given_options(args, {"task": (args.task, task_cls.options)})["task"])
            print(task.info(args.data))
            print(task.skipped.summary(limit=20))
            if args.data_command == "check":
                if task.skipped:
                    print(f"not ok: {task.skipped.headline()} in {args.data}")
                    return 1
                print(f"ok: {args.data} matches the data card of task '{args.task}'")
    elif args.command == "predict":
        from workbench.run import predict

        record = predict(
            args.run, args.input, args.output, overwrite=args.overwrite, trust_modified=args.trust_modified,
            device=args.device,
        )
        if "problems" in record["run_seal"]:
            print(_seal_line(args.run, record["run_seal"]))
        print(f"wrote {record['records']} row(s) to {args.output}, {record['failed']} without scores (see status)")
    elif args.command == "verify":
        return _verify(args.folder)
    elif args.command == "serve":
        return _serve(args)
    elif args.command == "audit":
        return _audit_verify(args.log)
    elif args.command == "card":
        from workbench.card import write_card

        print(f"wrote {write_card(args.run_folder, args.output, overwrite=args.overwrite)}")
    elif args.command == "pretrain":
        task = tasks.get(args.domain)()
        from workbench.errors import UserError

        stage = {} if args.stage is None else {"stage": args.stage}
        if stage and args.stage not in task.pretrain_stages:
            stages = ", ".join(map(repr, task.pretrain_stages))
            offered = f"the stages {stages}" if stages else "one stage"
            raise UserError(f"--stage {args.stage}: task '{args.domain}' pretrains in {offered}")
        print(task.pretrain(Path(args.out), epochs=args.epochs, seed=args.seed, device=args.device, quiet=args.quiet,
                            **stage))  # fmt: skip
    return 0


def _seal_line(run: str, sealed: dict[str, Any]) -> str:
    """What ``evaluate`` and ``predict`` print about the run's seal (`workbench.seal.check_run`)."""
    if sealed["status"] == "verified":
        return f"run {run}: {sealed['files']} files match its seal.json"
    if sealed["status"] == "unsealed":
        return f"run {run}: no seal.json (written before runs were sealed): not verified"
    return f"run {run}: {sealed['status']}: " + "; ".join(sealed["problems"])


def _one_line_warning(message: Any, category: type, *where: Any, **more: Any) -> None:
    """How the command line shows a Python warning (a renamed flag's `FutureWarning`): one line on stderr."""
    print(f"workbench: warning: {message}", file=sys.stderr)


#: How an interrupted command continues, by command (the others start again).
_CONTINUES = {
    "adapt": "continue with the same command plus --resume (and the same --out)",
    "compare": "run the same command again to continue (finished cells are kept)",
}
#: Commands whose flags include the task's options (``--allow-paths-outside`` among them).
_TASK_OPTION_COMMANDS = ("adapt", "compare", "data")


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: user errors, and files that cannot be written for a reason of their disk (full,
    read-only, not permitted), print one line and exit 2, without a traceback; Ctrl-C exits 130."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from workbench.errors import UserError, disk_error
    from workbench.paths import PathOutsideData

    words = list(sys.argv[1:] if argv is None else argv)
    command = words[0] if words else ""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            code = run(words)
    except UserError as error:
        message = str(error)
        if isinstance(error, PathOutsideData) and command not in _TASK_OPTION_COMMANDS:  # it takes no such flag
            message = f"{error.problem}; copy the file into that folder to read it"
        print(f"workbench: error: {message}", file=sys.stderr)
        code = 2
    except OSError as error:
        problem = disk_error(error)
        if problem is None:
            raise
        print(f"workbench: error: {problem}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        then = _CONTINUES.get(command)
        print("workbench: interrupted" + (f"; {then}" if then else ""), file=sys.stderr)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
