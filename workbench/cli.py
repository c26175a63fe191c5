"""The ``workbench`` command: a thin layer that parses options and calls the Python API.

Exit codes: 0 success; 2 bad input (the message names the file, field or option to fix); 130
interrupted (the run can be resumed with ``--resume``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from workbench.config import RunRequest
from workbench.options import resolve_options

EXAMPLES = """examples (every task: workbench list):
  workbench adapt --domain TASK                           # the task's method + baselines on its embedded data
  workbench adapt --domain TASK --method full --epochs 100 --out runs/full
  workbench adapt --domain TASK --baselines full,readout@OTHER_MODEL
  workbench adapt --domain TASK --out runs/x --resume     # continue an interrupted run
  torchrun --nproc_per_node 2 -m workbench adapt --domain TASK --out runs/ddp
  workbench evaluate --run runs/x --data PATH
  workbench data info TASK · workbench data check TASK --data PATH · workbench data generate TASK --out DIR
  workbench predict --run runs/x --input FOLDER --output predictions.csv
  workbench list
"""


def _examples(chosen: dict[str, list[str]] | None) -> str:
    """The engine's examples, then each registered task's own (`workbench.task.Task.examples`): every task's for
    help (``chosen`` None), none otherwise."""
    from workbench.registry import tasks

    lines = [EXAMPLES.rstrip("\n")]
    for name, cls in tasks.items() if chosen is None else ():
        lines += [f"  {example}" for example in cls.examples]
    return "\n".join(lines) + "\n"


#: Where each kind of plug-in option is declared: (registry, class attribute).
_OPTION_KINDS = {
    "task": ("tasks", "options"),
    "method": ("methods", "options"),
    "generate": ("tasks", "generate_options"),
}


def _plugin_options(kinds: Sequence[str], chosen: dict[str, list[str]] | None) -> dict[str, tuple[Any, list[str]]]:
    """Every option declared by the registered plug-ins of some kinds (only the ``chosen`` ones of each kind, unless
    it is None): name -> (Option, owners as "KIND NAME")."""
    from workbench import registry

    found: dict[str, tuple[Any, list[str]]] = {}
    for kind in kinds:
        plugins, attribute = _OPTION_KINDS[kind]
        known = getattr(registry, plugins)
        pairs = known.items() if chosen is None else [(name, known.get(name)) for name in chosen.get(kind, [])]
        for name, cls in pairs:
            for option in getattr(cls, attribute):
                found.setdefault(option.name, (option, []))[1].append(f"{kind} {name}")
    return found


def _add_plugin_options(parser: argparse.ArgumentParser, chosen: dict[str, list[str]] | None, *kinds: str) -> None:
    """One flag per option name of the plug-ins of ``kinds`` (a task and a method may declare the same name: the
    flag then goes to whichever of the two chosen ones declares it, see `_given_options`)."""
    group = parser.add_argument_group("plug-in options (each applies to the plug-ins named)")
    for name, (option, owners) in sorted(_plugin_options(kinds, chosen).items()):
        default = f"default {option.default}" if len(owners) == 1 else "default: the plug-in's own"
        text = f"[{', '.join(owners)}] {option.help} ({default})"
        if option.type is bool:  # a switch: present means True
            group.add_argument(option.flag, dest=f"opt_{name}", action="store_const", const=True, help=text)
        else:
            choices = option.choices if len(owners) == 1 else None  # each owner checks its own choices
            group.add_argument(option.flag, dest=f"opt_{name}", type=option.type, choices=choices, help=text)


def _given_options(args: argparse.Namespace, owners: dict[str, tuple[str, Sequence[Any]]]) -> dict[str, dict]:
    """The plug-in options given on the command line, split by kind: ``owners`` maps each kind to the chosen
    plug-in's (name, declared options). A flag no chosen plug-in declares, or two declare, is a `UserError`."""
    from workbench.errors import UserError

    given = {key[4:]: value for key, value in vars(args).items() if key.startswith("opt_") and value is not None}
    split: dict[str, dict] = {kind: {} for kind in owners}
    label = {"task": "task", "method": "method", "generate": "the data generator of task"}
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


def _chosen_plugins(argv: Sequence[str]) -> dict[str, list[str]] | None:
    """The plug-ins a command line uses, by kind (``{"task": [...], "method": [...]}``): only their modules need to
    be imported to parse it. None when it asks for help or names no task: then every plug-in is loaded."""
    from workbench.registry import tasks

    argv = list(argv)
    if not argv or "-h" in argv or "--help" in argv:
        return None
    if argv[0] == "adapt":
        values = {}
        for index, word in enumerate(argv):
            for flag in ("--domain", "--method"):
                if word == flag and index + 1 < len(argv):
                    values[flag] = argv[index + 1]
                elif word.startswith(flag + "="):
                    values[flag] = word.split("=", 1)[1]
        if "--domain" not in values:
            return None
        method = values.get("--method") or tasks.get(values["--domain"]).default_method
        return {"task": [values["--domain"]], "method": [method]}
    if argv[0] == "data":
        if len(argv) < 3 or argv[2].startswith("-"):
            return None
        return {"task": [argv[2]], "generate": [argv[2]] if argv[1] == "generate" else []}
    return {}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line parsed, importing only the plug-ins it names (`_chosen_plugins`); a flag of another
    plug-in (or a request for help) parses again with every plug-in loaded, for the full help and messages."""
    chosen = _chosen_plugins(argv)
    if chosen is not None:
        try:
            args, unknown = build_parser(chosen).parse_known_args(argv)
            if not unknown:
                return args
        except SystemExit:
            pass
    return build_parser().parse_args(argv)


def build_parser(chosen: dict[str, list[str]] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, with the options of the ``chosen`` plug-ins (`_chosen_plugins`; None: all)."""
    examples = _examples(chosen)
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Adapt pretrained scientific models to your data.",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("list", help="registered tasks, models and methods, with their data cards")

    adapt = commands.add_parser(
        "adapt",
        help="adapt a pretrained model (chosen method + baselines)",
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for parameter in RunRequest.parameters():
        meta = parameter.metadata
        flag = meta["flag"] or "--" + parameter.name.replace("_", "-")
        if parameter.type in ("bool", bool):
            adapt.add_argument(flag, dest=parameter.name, action="store_true", help=meta["help"])
        else:
            default = parameter.default if parameter.default not in (None, dataclasses.MISSING) else None
            suffix = f" (default {default})" if default is not None else ""
            adapt.add_argument(flag, dest=parameter.name, help=meta["help"] + suffix, **meta["argparse"])
    adapt.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    adapt.add_argument("--quiet", action="store_true", help="no progress bars or table")
    _add_plugin_options(adapt, chosen, "task", "method")

    evaluate = commands.add_parser("evaluate", help="re-score a finished run on other data")
    evaluate.add_argument("--run", required=True, help="run directory")
    evaluate.add_argument("--data", help="data to score on (default: the run's own); its test split is used")
    evaluate.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    _add_threads(evaluate)

    data = commands.add_parser("data", help="inspect, check or generate a task's data")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    for action, text in (
        ("info", "describe the data (default: the embedded data)"),
        ("check", "check a dataset against the task's data card"),
    ):
        sub = data_commands.add_parser(action, help=text)
        sub.add_argument("task")
        sub.add_argument("--data", required=action == "check")
        _add_plugin_options(sub, chosen, "task")
    generate = data_commands.add_parser(
        "generate", help="generate data with the task's generator (real simulators, or known ground truth)"
    )
    generate.add_argument("task")
    generate.add_argument("--out", required=True, help="output folder")
    generate.add_argument("--seed", type=int, help="seed of the generator (default: the task's own)")
    _add_threads(generate)
    _add_plugin_options(generate, chosen, "task", "generate")

    predict = commands.add_parser("predict", help="score every record of a folder with a finished run's model")
    predict.add_argument("--run", required=True, help="run directory (from workbench adapt)")
    predict.add_argument("--input", required=True, help="folder of inputs (records, files: what the run's task reads)")
    predict.add_argument("--output", required=True, help="CSV to write (a .json with hashes is written beside it)")
    _add_threads(predict)

    pretrain = commands.add_parser("pretrain", help="train the task's shipped foundation model from scratch")
    pretrain.add_argument("--domain", required=True)
    pretrain.add_argument("--out", required=True, help="checkpoint path (.safetensors)")
    pretrain.add_argument("--epochs", type=int, default=100)
    pretrain.add_argument("--seed", type=int, default=0)
    pretrain.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    pretrain.add_argument("--quiet", action="store_true")
    pretrain.add_argument("--stage", help="what to make, for tasks that pretrain in stages (default: the model)")
    _add_threads(pretrain)
    return parser


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, help="CPU threads (default: chosen at start, see workbench.threads)")


def _list() -> str:
    from workbench.datacard import load_card
    from workbench.registry import methods, models, tasks

    def card_line(name: str | None, label: str = "card") -> str:
        return f"\n{'':14}{label}: {name} — {load_card(name).title}" if name else ""

    lines = ["tasks:"]
    for name, cls in tasks.items():
        reads = "".join(card_line(card, "also reads") for card in cls.reads)
        missing = [package for package in cls.requires if importlib.util.find_spec(package) is None]
        needs = f' [not installed: pip install -e ".[{cls.extra}]"]' if missing else ""
        precisions = f"\n{'':14}--precision: {' '.join(cls.precisions)}"
        lines.append(f"  {name:12}{cls.description}{needs}{card_line(cls.card)}{reads}{precisions}")
    lines += ["models:"]
    lines += [f"  {name:12}{cls.description}{card_line(cls.card)}" for name, cls in models.items()]
    lines += ["methods:"]
    lines += [f"  {name:15}{cls.description}" for name, cls in methods.items()]
    missing = [
        (kind, name, why)
        for kind, r in (("task", tasks), ("model", models), ("method", methods))
        for name, why in sorted(r.unavailable.items())
        if name not in r.names()
    ]
    if missing:
        lines += ["not installed (their extra is missing):"]
        lines += [f"  {kind} {name}: {why}" for kind, name, why in missing]
    return "\n".join(lines)


def run(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if getattr(args, "quiet", False):
        logging.getLogger().setLevel(logging.WARNING)
    import workbench
    from workbench.registry import methods, tasks
    from workbench.threads import use_threads

    if args.command != "adapt" and hasattr(args, "threads"):  # adapt chooses its own (and keeps it on --resume)
        use_threads(args.threads)

    if args.command == "list":
        print(_list())
    elif args.command == "adapt":
        from workbench.run import run_request

        task_cls = tasks.get(args.domain)
        method_name = args.method or task_cls.default_method
        given = {p.name: getattr(args, p.name) for p in RunRequest.parameters() if getattr(args, p.name) is not None}
        options = _given_options(
            args, {"task": (args.domain, task_cls.options), "method": (method_name, methods.get(method_name).options)}
        )
        request = RunRequest(**given, task_options=options["task"], method_options=options["method"])
        run_request(request, resume=args.resume, quiet=args.quiet)
    elif args.command == "evaluate":
        metrics = workbench.evaluate(args.run, data=args.data, device=args.device)
        print("\n".join(f"{name:28}{value:12.3f}" for name, value in metrics.items()))
    elif args.command == "data":
        task_cls = tasks.get(args.task)
        if args.data_command == "generate":
            given = _given_options(
                args, {"task": (args.task, task_cls.options), "generate": (args.task, task_cls.generate_options)}
            )
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

        record = predict(args.run, args.input, args.output)
        print(f"wrote {record['records']} row(s) to {args.output}, {record['failed']} without scores (see status)")
    elif args.command == "pretrain":
        task = tasks.get(args.domain)()
        import inspect

        from workbench.errors import UserError

        stage = {} if args.stage is None else {"stage": args.stage}
        if stage and "stage" not in inspect.signature(task.pretrain).parameters:
            raise UserError(f"--stage: task '{args.domain}' pretrains in one stage; leave --stage out")
        print(task.pretrain(Path(args.out), epochs=args.epochs, seed=args.seed, device=args.device, quiet=args.quiet,
                            **stage))  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: user errors print one line and exit 2, without a traceback."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from workbench.errors import UserError

    try:
        code = run(argv)
    except UserError as error:
        print(f"workbench: error: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(
            "workbench: interrupted; continue with the same command plus --resume (and the same --out)", file=sys.stderr
        )
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
