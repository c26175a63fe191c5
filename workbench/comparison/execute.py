"""``workbench compare``: run every cell of a design not yet recorded, then summarise and seal the comparison.

Every record can be audited: it holds the epoch its run kept (``kept_epoch``) and a ``manifest`` (`cell_manifest`:
configuration hash, data fingerprint, package versions, source commit, steps, kept epoch, wall time), and
`rerun_cell` (``workbench compare --rerun-cell ID DIR``) runs one cell again in a temporary folder and sets its
metrics and hashes beside the recorded ones. Records written before the manifest existed lack both keys. Each cell
folder is sealed (`workbench.core.seal`: its run's files and ``cell.json``, sha256 and size) before its record appears,
the comparison seals its own files when it writes its report, and the report step verifies every cell first: a record
changed after it was written is refused, naming it (``workbench verify DIR`` checks the whole comparison).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any, Sequence

from workbench.comparison import report as comparison_report
from workbench.comparison.cells import run_cells
from workbench.comparison.design import (
    COMPUTE,
    EXECUTORS,
    SPEC_FLAGS,
    Cell,
    CompareSpec,
    cell_request,
    json_object,
    plan_cells,
    read_spec,
)
from workbench.core.checkpoint import write_json
from workbench.core.config import resolve_config
from workbench.core.errors import UserError
from workbench.core.seal import seal, verify, verify_seal
from workbench.run.rundir import claim_run_dir

_log = logging.getLogger("workbench")


def compare(
    spec: CompareSpec,
    out: str | Path,
    *,
    workers: int = 1,
    threads: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    quiet: bool = False,
    cell_reports: bool = False,
    share: bool = True,
    side_by_side: bool = False,
) -> dict[str, Any]:
    """Run every cell of ``spec`` not yet recorded in ``out``, then write ``comparison.json`` and ``report.md``.

    ``workers``: cells at a time (1: in this process); ``threads``: CPU threads of each cell (fixed, never chosen
    from the machine's load, so that executors and reruns agree bit for bit; more cores are better used by more
    workers than by more threads per cell on small models); ``executor`` "dask" runs them on the Dask cluster at
    ``scheduler`` (an address such as ``tcp://host:8786``), or on a local Dask cluster of ``workers`` processes when
    none is given. Before the data are read, prints the design (`workbench.comparison.report.design`; ``quiet``:
    only a design that cannot give a verdict, as a warning). ``cell_reports``: every cell's run writes its own
    ``report.md`` and plots (the comparison's report is always written); ``share``: each worker computes the data,
    model, splits and base scores of a seed or (fold, seed) once for all its cells (`workbench.core.reuse`; False: every
    cell computes its own, the same numbers, slower). ``side_by_side`` is deprecated and does nothing (seeds batched
    into one computation did not pay; removed in 0.2, the keyword goes in 0.3). Returns the comparison (what
    ``comparison.json`` holds).
    """
    if side_by_side:
        warnings.warn("compare(side_by_side=True) is deprecated and does nothing since 0.2 (batching seeds did not "
                      "pay): the cells train one seed at a time", FutureWarning, stacklevel=2)  # fmt: skip
    spec.check()
    if workers < 1 or threads < 1:
        raise UserError(f"--workers and --threads must be at least 1, got {workers} and {threads}")
    if executor not in EXECUTORS:
        raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    out = Path(out)
    resume = _check_spec(out, spec)
    if resume:
        _check_threads(out, threads)
    line, problem = comparison_report.design(spec)  # before the data are read and any cell runs
    if not quiet:
        print("\n".join(text for text in (line, problem) if text), flush=True)
    elif problem:
        _log.warning("%s", problem)
    cells, facts = plan_cells(spec, quiet)
    for cell in cells[: len(spec.methods)]:  # each method's settings, checked before anything is written
        for rate in spec.lr_grid or (spec.learning_rate,):
            resolve_config(cell_request(spec, cell, out, rate, None))
    with claim_run_dir(out, resume=resume, continues=None):  # no spec.json: nothing a rerun could continue
        if not resume:
            write_json(out / "spec.json", spec.to_dict())
        if not (out / COMPUTE).is_file():
            write_json(out / COMPUTE, {"threads": threads})
        records = run_cells(spec, cells, out, (workers, threads), executor, scheduler, quiet, (cell_reports, share),
)  # fmt: skip
        _verify_cells(out, cells)
        comparison = comparison_report.summarise(spec, facts, records)
        write_json(out / "comparison.json", comparison)
        comparison_report.write(comparison, out)
        seal(out, "comparison")  # its own files; each cell's folder holds its own seal
    if not quiet:
        print(comparison_report.console_table(comparison))
        print(f"comparison written to {out}")
    return comparison


def _verify_cells(out: Path, cells: Sequence[Cell]) -> None:
    """Every cell's record and run files verify against their seals (`workbench.core.seal.verify`: signed by a trusted
    key, complete, unchanged) before they are summarised.

    Raises:
        UserError: one line naming the first problem (a changed or added file, a bad or untrusted seal, a cell folder
            without one).
    """
    for cell in cells:
        result = verify(out / "cells" / cell.name)
        problems = result.problems + [verify_seal(folder)[0] for folder in result.unsealed]
        if problems:
            more = f" (and {len(problems) - 1} more: workbench verify {out})" if len(problems) > 1 else ""
            raise UserError(f"{problems[0]}{more}; the report uses only records that verify against their seals: "
                            f"remove {out / 'cells' / cell.name} to run that cell again")  # fmt: skip


def _check_spec(out: Path, spec: CompareSpec) -> bool:
    """Whether ``out`` holds this comparison already (to continue); a `UserError` when it holds another (naming the
    fields that differ) or its ``spec.json`` cannot be read."""
    written = out / "spec.json"
    if not written.is_file():
        return False
    earlier = read_spec(written).to_dict()
    now = spec.to_dict()
    changed = [key for key in now if earlier.get(key) != now[key]]
    if changed:
        details = "; ".join(f"{SPEC_FLAGS.get(key, key)}: was {json.dumps(earlier.get(key))}, now "
                            f"{json.dumps(now[key])}" for key in changed)  # fmt: skip
        raise UserError(f"{out} holds a comparison with other settings ({details}; its spec.json); give another "
                        "--out, or the same settings to continue it")  # fmt: skip
    return True


def _check_threads(out: Path, threads: int) -> None:
    """A rerun computes with the ``--threads`` the comparison in ``out`` computed with (its ``compute.json``; for a
    comparison written before there was one: its recorded cells' threads); a `UserError` naming them when not."""
    path = out / COMPUTE
    if path.is_file():
        content = json_object(path)
        if isinstance(content, str) or not isinstance(content.get("threads"), int):
            raise UserError(f"{path}: damaged ({content if isinstance(content, str) else 'no threads'}); the threads "
                            "this comparison computed with cannot be read: give another --out")  # fmt: skip
        earlier, source = {content["threads"]}, path.name
    else:
        records = [json_object(record) for record in sorted(out.glob("cells/*/*/cell.json"))]
        earlier = {r["threads"] for r in records if isinstance(r, dict) and isinstance(r.get("threads"), int)}
        source = "its cells' cell.json"
    if earlier and earlier != {threads}:
        shown = ", ".join(map(str, sorted(earlier)))
        raise UserError(f"{out}: its cells computed with --threads {shown} ({source}), this command with --threads "
                        f"{threads}; the thread count changes the numbers, so the cells would not be comparable: give "
                        f"--threads {shown} to continue it, or another --out")  # fmt: skip
