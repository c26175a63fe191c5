"""``workbench compare``: its flags, the `workbench.comparison.design.CompareSpec` of a command line, and the three
things it does: a comparison, its planning (``--plan``, no cell run) and one recorded cell run again
(``--rerun-cell``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from pathlib import Path
from typing import Any, Sequence

from workbench.cli.flags import (
    _add_plugin_options,
    _add_seal_key,
    _add_settings,
    _domain_help,
    _given_options,
    _width,
    _with_default,
)

#: ``compare --help``'s examples (placeholders: TASK, methods A, B, C; each parses, tests/test_compare_defaults.py).
COMPARE_EXAMPLES = """examples:
  workbench compare --domain TASK --methods A,B                # default design: 3 folds × seeds 200-202
  workbench compare --domain TASK --methods A,B --learner B    # A does not move from the base model: B shows training
  workbench compare --domain TASK --methods A,B,C --folds 5 --seeds 200-204 --workers 2
  workbench compare --domain TASK --methods A,B --budget convergence --lr-grid 3e-4,1e-3,3e-3
  workbench compare --domain TASK --methods A,B --plan --sd 0.02 --effect 0.03   # the seeds a difference needs
"""


def _add_compare_command(commands: Any, chosen: dict[str, list[str]] | None) -> None:
    """``workbench compare``: its flags (`workbench.comparison.design.CompareSpec`, whose defaults they show and
    take) and the chosen task's options."""
    from workbench.comparison.design import BUDGETS, EXECUTORS, CompareSpec
    from workbench.comparison.statistics import MIN_UNITS

    spec = {f.name: f.default for f in dataclasses.fields(CompareSpec) if f.default is not dataclasses.MISSING}
    seeds = _seeds_text(spec["seeds"])
    compare = commands.add_parser(
        "compare",
        help="compare methods on grouped folds and seeds, with paired intervals",
        usage="workbench compare --domain TASK --methods A,B[,C] [options]\n"
        "       workbench compare --rerun-cell ID DIR",
        description=textwrap.fill(_compare_description(spec), _width()),
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
    flags.add_argument("--side-by-side", action="store_true", help=argparse.SUPPRESS)  # deprecated in 0.2
    _add_seal_key(flags)
    flags.add_argument("--quiet", action="store_true", help="no design, progress bar or table (warnings stay)")
    _add_settings(compare.add_argument_group("run options (every cell's, as workbench adapt takes them)"), "compare")
    _add_planning_flags(compare)
    _add_plugin_options(compare, chosen, "task")


def _compare_description(spec: dict[str, Any]) -> str:
    """What ``compare --help`` says above its flags, from `CompareSpec`'s defaults (``spec``: field -> default)."""
    from workbench.comparison.design import DEVELOPMENT_SEEDS_BELOW, FIRST_REPORTED_SEED
    from workbench.comparison.statistics import MIN_UNITS

    seeds = _seeds_text(spec["seeds"])
    return (
        "Every method on the same grouped folds (each group tested once per seed) and seeds, at one budget; "
        "report.md gives mean ± sd and the paired difference to the reference over seeds (the folds of a seed "
        f"averaged): a 95 % t interval, a Holm-adjusted p and the minimum detectable difference; no verdict below "
        f"{MIN_UNITS} seeds. The default design, {spec['folds']} folds × seeds {seeds}, can reach one; it is printed "
        f"before any cell runs. --plan sizes a comparison before running it. Seeds below {DEVELOPMENT_SEEDS_BELOW} are "
        f"for development, {DEVELOPMENT_SEEDS_BELOW}–{FIRST_REPORTED_SEED - 1} were spent on earlier reports: report "
        f"seeds from {FIRST_REPORTED_SEED} on. Re-running the same command continues an "
        "interrupted comparison."
    )


def _add_planning_flags(compare: argparse.ArgumentParser) -> None:
    """``compare --plan`` and what it reads: the seeds a comparison needs, sized before any cell runs (`_plan`)."""
    power = compare.add_argument_group("planning (no cell is run)")
    power.add_argument("--plan", action="store_true", help="print the design, the minimum detectable difference of "
                       "the planned seeds (80 %% power) and, with --effect, the seeds needed; run nothing")  # fmt: skip
    power.add_argument("--sd", type=float, metavar="FLOAT", help="standard deviation of one seed's mean paired "
                       "difference (--plan needs it or --pilot)")  # fmt: skip
    power.add_argument("--pilot", metavar="DIR",
                       help="a finished comparison folder whose seeds give that standard deviation")  # fmt: skip
    power.add_argument("--effect", type=float, metavar="FLOAT", help="the difference to detect: how many seeds it "
                       "needs (default: none, the MDD only)")  # fmt: skip


def _seeds_text(seeds: Sequence[int]) -> str:
    """``--seeds`` as a command line gives them: FIRST-LAST for consecutive seeds, else comma-separated."""
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _compare_spec(args: argparse.Namespace) -> Any:
    """The `workbench.comparison.design.CompareSpec` of a ``compare`` command line."""
    from workbench.comparison.design import CompareSpec, entry_of, methods_task_options
    from workbench.core.config import variant_options
    from workbench.core.errors import UserError
    from workbench.core.options import renamed
    from workbench.core.registry import methods, tasks
    from workbench.core.settings import settings_for

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
    for label in method_names:  # a variant the method declares: its options, under what --set gives
        entry = entry_of(label)
        if entry.variant is not None and entry.variant in methods.get(entry.method).variants:
            method_options[label] = {**variant_options(label), **method_options.get(label, {})}
    task_cls = tasks.get(args.domain)
    options = _given_options(args, {"task": (args.domain, task_cls.options)})["task"]
    options = {**methods_task_options(args.domain, method_names, options), **options}  # what the methods' settings ask
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
    from workbench.comparison.rerun import RERUN_TOLERANCE, rerun_cell

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
    needs, from ``--sd`` or a ``--pilot`` comparison folder (`workbench.comparison.report.plan`); runs no cell."""
    from workbench.comparison.report import plan
    from workbench.core.errors import UserError

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


def run_compare(args: argparse.Namespace) -> int:
    """``workbench compare``: one recorded cell again (``--rerun-cell``: 1 when it does not reproduce), the plan
    (``--plan``), or the comparison (`workbench.comparison.execute.compare`) in ``--out``."""
    if args.rerun_cell:
        return _rerun_cell(*args.rerun_cell)
    if args.plan:
        _plan(args)
        return 0
    from datetime import datetime

    from workbench.comparison.execute import compare

    out = args.out or f"runs/compare-{args.domain}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    compare(_compare_spec(args), out, workers=args.workers, threads=args.threads, executor=args.executor,
            scheduler=args.scheduler, quiet=args.quiet, cell_reports=args.cell_reports,
            share=not args.no_share, side_by_side=args.side_by_side)  # fmt: skip
    return 0
