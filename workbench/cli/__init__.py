"""The ``workbench`` command: a thin layer that parses options and calls the Python API.

Exit codes: 0 success; 2 bad input (the message names the file, field or option to fix), or a file the disk
refuses (full, read-only, not permitted); 130 interrupted (``adapt`` continues with ``--resume``, ``compare`` with the
same command).

`main` and `run` live here, with `COMMANDS`, the handler of each command; the parser is built and a command line
parsed in `workbench.cli.parser` (the flags several commands share: `workbench.cli.flags`); each command's flags and
handler live in its own module (``adapt``, ``compare``, ``evaluate``, ``predict``, ``data``, ``verify``, ``serve``
with ``audit``, ``card``, ``calibrate``, ``pretrain``, ``listing`` for ``list``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from typing import Any, Callable, Sequence

from workbench._forward import forwarder
from workbench.cli import (
    adapt,
    calibrate,
    card,
    compare,
    dashboard,
    data,
    evaluate,
    listing,
    predict,
    pretrain,
    serve,
    verify,
)
from workbench.cli.parser import parse

# Engine modules (torch among their imports) are imported where used: a mistyped task or method is refused before.

#: The handler of each command: the parsed command line -> the exit code.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": listing.run_list,
    "adapt": adapt.run_adapt,
    "compare": compare.run_compare,
    "evaluate": evaluate.run_evaluate,
    "data": data.run_data,
    "predict": predict.run_predict,
    "verify": verify.run_verify,
    "serve": serve.run_serve,
    "audit": serve.run_audit,
    "dashboard": dashboard.run_dashboard,
    "card": card.run_card,
    "calibrate": calibrate.run_calibrate,
    "pretrain": pretrain.run_pretrain,
}

#: The names of 0.1's single ``cli.py`` (``workbench.cli._list``, ``workbench.cli.parse``, ...) from the modules
#: that hold them now, with a `FutureWarning`, until 0.3.
__getattr__ = forwarder(
    __name__,
    tuple(f"{__name__}.{module}" for module in ("parser", "flags", "adapt", "compare", "evaluate", "predict", "data",
                                                "verify", "serve", "card", "pretrain", "listing")),  # fmt: skip
    {},
)


def _quiet_console() -> None:
    """``--quiet``: log records below WARNING stay off the terminal. The workbench's loggers set their own level (a
    run copies INFO into its log.txt), so the console handlers' level is raised, not only the root logger's."""
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for handler in root.handlers:
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout):
            handler.setLevel(logging.WARNING)


def run(argv: Sequence[str] | None = None) -> int:
    """The command ``argv`` (default: the process's arguments) names, run (`COMMANDS`): its exit code."""
    args = parse(sys.argv[1:] if argv is None else argv)
    if getattr(args, "quiet", False):
        _quiet_console()
    from workbench.run.threads import use_threads

    if args.command != "adapt" and hasattr(args, "threads"):  # adapt chooses its own (and keeps it on --resume)
        use_threads(args.threads)
    if getattr(args, "seal_key", None) is None:
        return COMMANDS[args.command](args)
    from workbench.core.sealkeys import key_in_use

    with key_in_use(args.seal_key):  # ``--seal-key``: this command's seals (`workbench.core.sealkeys`)
        return COMMANDS[args.command](args)


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
    from workbench.core.errors import UserError, disk_error
    from workbench.core.paths import PathOutsideData

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
    except KeyboardInterrupt as interrupt:
        then = _CONTINUES.get(command)
        folder = getattr(interrupt, "run_dir", None)  # `workbench.run.rundir.RunInterrupted`: the run's folder
        if command == "adapt" and folder is not None:
            then = f"the run is in {folder}: continue it with the same command plus --resume --out {folder}"
        print("workbench: interrupted" + (f"; {then}" if then else ""), file=sys.stderr)
        code = 130
    sys.exit(code)

