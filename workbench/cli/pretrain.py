"""``workbench pretrain``: a task's shipped foundation model trained from scratch (in stages, for tasks that have
them)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from workbench.cli.flags import _add_device, _add_threads, _domain_help


def _add_pretrain_command(commands: Any) -> None:
    """``workbench pretrain --domain TASK --out FILE``."""
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


def run_pretrain(args: argparse.Namespace) -> int:
    """``workbench pretrain``: what the task's ``pretrain`` wrote; a ``--stage`` the task does not have is refused."""
    from workbench.core.registry import tasks

    task = tasks.get(args.domain)()
    from workbench.core.errors import UserError

    stage = {} if args.stage is None else {"stage": args.stage}
    if stage and args.stage not in task.pretrain_stages:
        stages = ", ".join(map(repr, task.pretrain_stages))
        offered = f"the stages {stages}" if stages else "one stage"
        raise UserError(f"--stage {args.stage}: task '{args.domain}' pretrains in {offered}")
    print(task.pretrain(Path(args.out), epochs=args.epochs, seed=args.seed, device=args.device, quiet=args.quiet,
                        **stage))  # fmt: skip
    return 0
