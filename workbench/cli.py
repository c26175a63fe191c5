"""The ``workbench`` command: a thin layer that parses options and calls the Python API.

Exit codes: 0 success; 2 bad input (the message names the file, field or option to fix); 130
interrupted (the run can be resumed with ``--resume``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

EXAMPLES = """examples:
  workbench adapt --domain rmd17                          # ELoRA + baselines on the embedded DFT data
  workbench adapt --domain rmd17 --method full --epochs 100 --train-size 200 --out runs/full200
  workbench adapt --domain rmd17 --data ~/rmd17 --molecule aspirin --model MACE-OFF23_medium.model --trust-checkpoint
  torchrun --nproc_per_node 2 -m workbench adapt --domain rmd17 --out runs/ddp
  workbench adapt --domain rmd17 --out runs/x --resume    # continue an interrupted run
  workbench evaluate --run runs/x --data ~/rmd17/npz_data/rmd17_ethanol.npz
  workbench data info rmd17
  workbench data check rmd17 --data ~/rmd17 --molecule aspirin
  workbench data generate rmd17 --out my_rmd17 --molecules ethanol --frames 20 --level dft
  workbench adapt --domain features --method warmpot      # partial DA: a target site lacking classes
  workbench adapt --domain features --method dre-pp       # covariate shift: importance weights
  workbench data generate features --out my_problem --problem partial-da
  workbench adapt --domain csbm                           # homophily alignment (HGDA) + graph baselines on a CSBM pair
  workbench adapt --domain csbm --data ~/citation --source-graph acmv9 --target-graph dblpv7
  workbench data info csbm --target-homophily 0.2
  workbench adapt --domain ptbxl                          # H-Tuning, full, LoRA, a distilled student
  workbench adapt --domain ptbxl --data ~/ptb-xl --out runs/ptbxl
  workbench predict --run runs/ptbxl --input new_records/ --output predictions.csv
  workbench list
"""


def _plugin_options(kind: str) -> dict[str, tuple[Any, list[str]]]:
    """Every option declared by the registered plug-ins of one kind: name -> (Option, owners)."""
    from workbench.registry import methods, tasks

    registry = {"task": tasks, "method": methods}[kind]
    found: dict[str, tuple[Any, list[str]]] = {}
    for name, cls in registry.items():
        for option in cls.options:
            found.setdefault(option.name, (option, []))[1].append(name)
    return found


def _add_plugin_options(parser: argparse.ArgumentParser, kind: str) -> None:
    group = parser.add_argument_group(f"{kind} options (each applies to the {kind}s named)")
    for name, (option, owners) in sorted(_plugin_options(kind).items()):
        default = f"default {option.default}" if len(owners) == 1 else "default: the plug-in's own"
        group.add_argument(
            option.flag,
            dest=f"{kind}_opt_{name}",
            type=option.type,
            default=None,
            choices=option.choices,
            help=f"[{', '.join(owners)}] {option.help} ({default})",
        )


def _given_options(args: argparse.Namespace, kind: str, owner: str, declared: Sequence[Any]) -> dict[str, Any]:
    from workbench.errors import UserError

    prefix = f"{kind}_opt_"
    given = {
        key[len(prefix) :]: value for key, value in vars(args).items() if key.startswith(prefix) and value is not None
    }
    known = {option.name for option in declared}
    stray = sorted(set(given) - known)
    if stray:
        raise UserError(f"--{stray[0].replace('_', '-')} is not an option of {kind} '{owner}'")
    return given


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Adapt pretrained scientific models to your data.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("list", help="registered tasks, models and methods, with their data cards")

    adapt = commands.add_parser(
        "adapt",
        help="adapt a pretrained model (chosen method + baselines)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    adapt.add_argument("--domain", required=True, help="task name (see `workbench list`), e.g. rmd17")
    adapt.add_argument("--method", help="adaptation method (default: the task's, elora for rmd17)")
    adapt.add_argument("--baselines", help="comma-separated methods run beside it (default: the task's); '' for none")
    adapt.add_argument("--data", help="your data (default: the embedded data); for rmd17 an rMD17 npz/folder or extxyz")
    adapt.add_argument("--model", help="pretrained model file (default: the shipped foundation model)")
    adapt.add_argument("--trust-checkpoint", action="store_true", help="allow loading a pickled model (.model files)")
    adapt.add_argument("--out", help="run directory (default: runs/<task>-<method>-<time>)")
    adapt.add_argument("--epochs", type=int, help="maximum epochs (early stopping on validation may end sooner)")
    adapt.add_argument("--train-size", type=int, help="training samples drawn from the training split")
    adapt.add_argument("--val-size", type=int, help="validation samples (default: the task's or max(10, train-size/5))")
    adapt.add_argument("--batch-size", type=int, help="samples per step (per process under torchrun)")
    adapt.add_argument(
        "--patience", type=int, help="epochs without validation improvement before stopping (default 15)"
    )
    adapt.add_argument(
        "--ema-decay",
        type=float,
        default=0.99,
        help="moving average of the trained weights, used for validation and the result (0: off)",
    )
    adapt.add_argument("--lr", type=float, help="learning rate (default: each method's own)")
    adapt.add_argument(
        "--seed", type=int, default=0, help="seeds data selection, initialisation and shuffling (default 0)"
    )
    adapt.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default auto")
    adapt.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    adapt.add_argument("--quiet", action="store_true", help="no progress bars or table")
    _add_plugin_options(adapt, "task")
    _add_plugin_options(adapt, "method")

    evaluate = commands.add_parser("evaluate", help="re-score a finished run on other data")
    evaluate.add_argument("--run", required=True, help="run directory")
    evaluate.add_argument("--data", help="data to score on (default: the run's own); its test split is used")
    evaluate.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])

    data = commands.add_parser("data", help="inspect, check or generate a task's data")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    for action, text in (
        ("info", "describe the data (default: the embedded data)"),
        ("check", "check a dataset against the task's data card"),
    ):
        sub = data_commands.add_parser(action, help=text)
        sub.add_argument("task")
        sub.add_argument("--data", required=action == "check")
        _add_plugin_options(sub, "task")
    generate = data_commands.add_parser(
        "generate", help="generate data with real simulators (xTB, DFT) or known ground truth (features)"
    )
    generate.add_argument("task")
    generate.add_argument("--out", required=True, help="output folder")
    generate.add_argument(
        "--molecules", help="[rmd17] comma-separated molecules (default: ethanol; for --corpus the G2 set)"
    )
    generate.add_argument("--frames", type=int, help="[rmd17] frames per molecule (default 20)")
    generate.add_argument(
        "--corpus",
        action="store_true",
        default=None,
        help="[rmd17] write the GFN2-xTB pretraining corpus (one extxyz file) instead of target data",
    )
    generate.add_argument("--level", choices=["dft", "xtb"], help="[rmd17] labels: PBE/def2-SVP (default) or GFN2-xTB")
    generate.add_argument("--temperature", type=float, help="[rmd17] MD temperature [K] (default 500)")
    generate.add_argument("--seed", type=int, help="seed of the generator (default: the task's own)")
    _add_plugin_options(generate, "task")

    predict = commands.add_parser("predict", help="score every record of a folder with a finished run's model")
    predict.add_argument("--run", required=True, help="run directory (from workbench adapt)")
    predict.add_argument("--input", required=True, help="folder of records (for ptbxl: WFDB *.hea + data files)")
    predict.add_argument("--output", required=True, help="CSV to write (a .json with hashes is written beside it)")

    pretrain = commands.add_parser("pretrain", help="train the task's shipped foundation model from scratch")
    pretrain.add_argument("--domain", required=True)
    pretrain.add_argument("--out", required=True, help="checkpoint path (.safetensors; a .json is written beside it)")
    pretrain.add_argument("--epochs", type=int, default=100)
    pretrain.add_argument("--seed", type=int, default=0)
    pretrain.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    pretrain.add_argument("--quiet", action="store_true")
    return parser


def _list() -> str:
    from workbench.datacard import load_card
    from workbench.registry import methods, models, tasks

    def card_line(name: str | None, label: str = "card") -> str:
        return f"\n{'':14}{label}: {name} — {load_card(name).title}" if name else ""

    lines = ["tasks:"]
    for name, cls in tasks.items():
        reads = "".join(card_line(card, "also reads") for card in cls.reads)
        lines.append(f"  {name:12}{cls.description}{card_line(cls.card)}{reads}")
    lines += ["models:"]
    lines += [f"  {name:12}{cls.description}{card_line(cls.card)}" for name, cls in models.items()]
    lines += ["methods:"]
    lines += [f"  {name:15}{cls.description}" for name, cls in methods.items()]
    return "\n".join(lines)


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False):
        logging.getLogger().setLevel(logging.WARNING)
    import workbench
    from workbench.registry import methods, tasks

    if args.command == "list":
        print(_list())
    elif args.command == "adapt":
        task_cls = tasks.get(args.domain)
        method_name = args.method or task_cls.default_method
        baselines = None if args.baselines is None else [b for b in args.baselines.split(",") if b]
        workbench.adapt(
            args.domain,
            args.method,
            data=args.data,
            model=args.model,
            out=args.out,
            epochs=args.epochs,
            train_size=args.train_size,
            val_size=args.val_size,
            batch_size=args.batch_size,
            patience=args.patience,
            ema_decay=args.ema_decay,
            learning_rate=args.lr,
            seed=args.seed,
            device=args.device,
            resume=args.resume,
            quiet=args.quiet,
            trust_checkpoint=args.trust_checkpoint,
            baselines=baselines,
            method_options=_given_options(args, "method", method_name, methods.get(method_name).options),
            **_given_options(args, "task", args.domain, task_cls.options),
        )
    elif args.command == "evaluate":
        metrics = workbench.evaluate(args.run, data=args.data, device=args.device)
        print("\n".join(f"{name:28}{value:12.3f}" for name, value in metrics.items()))
    elif args.command == "data":
        task_cls = tasks.get(args.task)
        if args.data_command == "generate":
            given = {
                "molecules": args.molecules.split(",") if args.molecules else None,
                "n_frames": args.frames,
                "corpus": args.corpus,
                "level": args.level,
                "temperature_k": args.temperature,
                "seed": args.seed,
            }
            task = task_cls(**_given_options(args, "task", args.task, task_cls.options))
            print(_call_generate(task, Path(args.out), {k: v for k, v in given.items() if v is not None}))
        else:
            task = task_cls(**_given_options(args, "task", args.task, task_cls.options))
            print(task.info(args.data))
            if args.data_command == "check":
                print(f"ok: {args.data} matches the data card of task '{args.task}'")
    elif args.command == "predict":
        from workbench.run import predict

        record = predict(args.run, args.input, args.output)
        print(f"scored {record['records']} record(s), {record['failed']} failed; wrote {args.output}")
    elif args.command == "pretrain":
        task = tasks.get(args.domain)()
        print(task.pretrain(Path(args.out), epochs=args.epochs, seed=args.seed, device=args.device, quiet=args.quiet))
    return 0


def _call_generate(task: Any, out: Path, given: dict[str, Any]) -> str:
    """``task.generate(out, **given)``, refusing flags the task's generator does not take."""
    import inspect

    from workbench.errors import UserError

    accepted = inspect.signature(task.generate).parameters
    flags = {"n_frames": "--frames", "temperature_k": "--temperature"}
    for name in given:
        if name not in accepted:
            raise UserError(f"{flags.get(name, '--' + name)} does not apply to generating data for task '{task.name}'")
    return task.generate(out, **given)


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
