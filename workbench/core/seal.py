"""Sealed run folders: a manifest of every file a run (a comparison cell, a comparison) produced, and its check.

When a run finishes (`workbench.run.adapting.run_request`, after its log is closed) it writes ``seal.json``: for every
file it produced, the path relative to the folder, its sha256 and its size. A comparison cell extends its run's seal
with its record ``cell.json`` (`workbench.comparison.cells.run_cell`), and a comparison seals its own files
(``spec.json``, ``comparison.json``, ``report.md``, ``forest.png``) when it writes its report. Readers verify before
use: `evaluate` and `predict` (`check_run`: a mismatch is a `UserError` naming the file unless the caller trusts
modified files), the report step of `compare` (every cell), and ``workbench verify DIR`` (`verify`: a run or a whole
comparison).

``seal.json``::

    {"format": "workbench-seal/1", "kind": "run" | "cell" | "comparison", "sealed": "<UTC time>",
     "workbench_version": "...", "files": {"adapter.safetensors": {"sha256": "<hex>", "bytes": 1652}, ...}}

What a seal covers: every regular file below its folder, except hidden names (the lock ``.lock``, ``.owner.json``,
the temporary files of atomic writes: any path with a part starting with ``.``), ``seal.json`` itself and the files
of a subfolder that holds its own ``seal.json`` (a comparison's cells, a grid cell's runs: sealed by theirs, and
checked by `verify` in turn). Files added after sealing (``evaluations/`` that `evaluate` writes) are not in the seal;
`verify` lists them apart and does not count them as problems: nothing reads them as part of the run.

A run written before runs were sealed has no ``seal.json``: it reads with a warning (`check_run`), and
``workbench verify`` says it cannot be verified.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

from workbench.core.checkpoint import write_json
from workbench.core.errors import UserError

log = logging.getLogger("workbench")

#: The manifest's file name, in the folder it seals.
SEAL = "seal.json"
#: The manifest's format (its ``format`` field).
FORMAT = "workbench-seal/1"
#: What a reader is told to pass to use a folder whose files differ from its seal.
TRUST_FLAG = "--trust-modified"


def sha256_file(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _covered(folder: Path) -> Iterator[Path]:
    """The files a seal of ``folder`` covers (relative paths, sorted): see the module's docstring."""
    found = []

    def walk(current: Path) -> None:
        for entry in sorted(current.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_dir() and not entry.is_symlink():
                if not (entry / SEAL).is_file():  # a sealed subfolder is its own seal's
                    walk(entry)
            elif entry.is_file() and not (current == folder and entry.name == SEAL):
                found.append(entry.relative_to(folder))

    walk(folder)
    yield from sorted(found, key=lambda p: p.as_posix())


def seal(folder: str | Path, kind: str, pending: Mapping[str, bytes] | None = None, extend: bool = False) -> int:
    """Write ``folder/seal.json`` (atomically) over the files it covers; returns how many.

    Args:
        folder: the finished run, cell or comparison.
        kind: "run", "cell" or "comparison" (recorded; `verify` names it in messages).
        pending: files about to be written (relative path -> their bytes): sealed with the hash of those bytes, so
            that the seal never lags behind them (a cell's ``cell.json`` is written after its seal; a crash between
            the two leaves a seal naming a missing record, and the cell runs again).
        extend: the folder's existing seal (its run's) must still verify before it is extended: a file changed since
            then is a `UserError` naming it, never sealed anew.
    """
    folder = Path(folder)
    pending = dict(pending or {})
    if extend and (folder / SEAL).is_file():
        problems = [p for p in verify_seal(folder) if p.path.relative_to(folder).as_posix() not in pending]
        if problems:
            raise UserError(f"{problems[0]}; it is not sealed anew: remove {folder} to make it again")
    files: dict[str, dict[str, Any]] = {}
    for relative in _covered(folder):
        name = relative.as_posix()
        if name not in pending:
            path = folder / relative
            files[name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    for name, content in pending.items():
        files[name] = {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    import workbench

    write_json(folder / SEAL, {
        "format": FORMAT,
        "kind": kind,
        "sealed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "workbench_version": workbench.__version__,
        "files": dict(sorted(files.items())),
    })  # fmt: skip
    return len(files)


@dataclass(frozen=True)
class Problem:
    """One file that does not match the seal that lists it (``why``: in words, with the fix)."""

    path: Path
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def _read_seal(path: Path) -> dict[str, Any]:
    """The manifest in ``path``; a `ValueError` saying why when it is not one."""
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"not a readable seal ({error})") from None
    files = content.get("files") if isinstance(content, dict) else None
    if not isinstance(files, dict) or content.get("format") != FORMAT:
        raise ValueError(f"not a workbench seal (expected {{'format': '{FORMAT}', 'files': {{...}}}})")
    return content


#: When the files of each kind of sealed folder were sealed, in messages ("the file was changed ...").
_CHANGED = {
    "run": "after the run finished",
    "cell": "after the cell was recorded",
    "comparison": "after the comparison was written",
}


def verify_seal(folder: Path) -> list[Problem]:
    """The files ``folder/seal.json`` lists that are missing or differ from it (size, then sha256)."""
    path = folder / SEAL
    try:
        content = _read_seal(path)
    except ValueError as error:
        return [Problem(path, str(error))]
    files = content["files"]
    changed = _CHANGED.get(content.get("kind"), "after it was sealed")
    problems = []
    for name, entry in files.items():
        file = folder / name
        if not isinstance(entry, dict) or not {"sha256", "bytes"} <= set(entry):
            problems.append(Problem(path, f"entry {name!r} is not {{'sha256', 'bytes'}}: the seal is damaged"))
        elif not file.is_file():
            problems.append(Problem(file, f"missing, though {path} lists it (removed after it was sealed)"))
        elif file.stat().st_size != entry["bytes"]:
            problems.append(Problem(file, f"{file.stat().st_size} bytes, {path} says {entry['bytes']} (the file was "
                                          f"changed {changed})"))  # fmt: skip
        elif sha256_file(file) != entry["sha256"]:
            problems.append(Problem(file, f"sha256 differs from {path} (the file was changed {changed})"))
    return problems


def _should_be_sealed(folder: Path) -> bool:
    """Whether ``folder`` is what a finished run, cell or comparison leaves (and so should hold a seal)."""
    run = (folder / "config.yaml").is_file() and (folder / "metrics.json").is_file()
    return run or (folder / "cell.json").is_file() or (folder / "comparison.json").is_file()


@dataclass
class Verification:
    """What `verify` found below a folder."""

    #: Files checked against a seal (and found to match, less ``problems``).
    checked: int = 0
    #: Files that differ from their seal, are missing, or seals that cannot be read.
    problems: list[Problem] = field(default_factory=list)
    #: Folders of finished runs, cells or comparisons that hold no ``seal.json`` (written before runs were sealed).
    unsealed: list[Path] = field(default_factory=list)
    #: Files no seal covers (added after sealing, such as ``evaluations/``): listed, not problems.
    extra: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unsealed


def verify(folder: str | Path) -> Verification:
    """Check ``folder`` (a run, a cell, a comparison) and every sealed or finished folder below it against their
    seals: each sealed file is present with its size and sha256 (`verify_seal`)."""
    folder = Path(folder)
    result = Verification()
    covered: set[Path] = set()

    def visit(current: Path) -> None:
        if (current / SEAL).is_file():
            try:
                files = _read_seal(current / SEAL)["files"]
            except ValueError:
                files = {}
            problems = verify_seal(current)
            result.problems += problems
            result.checked += len(set(files) - {p.path.relative_to(current).as_posix() for p in problems})
            covered.update((current / name) for name in files)
        elif _should_be_sealed(current):
            result.unsealed.append(current)
        for entry in sorted(current.iterdir()):
            if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
                visit(entry)

    visit(folder)
    if result.unsealed or result.checked or result.problems:
        result.extra = [
            path
            for path in sorted(folder.rglob("*"))
            if path.is_file() and path not in covered and path.name != SEAL
            and not any(part.startswith(".") for part in path.relative_to(folder).parts)
        ]  # fmt: skip
    return result


def check_run(run: str | Path, trust_modified: bool = False) -> dict[str, Any]:
    """Verify the finished run ``run`` before a reader uses it; what the reader records about it.

    Returns ``{"status": "verified", "files": N}``; ``{"status": "unsealed"}`` for a run written before runs were
    sealed (with a warning); with ``trust_modified``, ``{"status": "modified, used with --trust-modified",
    "problems": [...]}`` (with a warning).

    Raises:
        UserError: one line naming the first file that differs from the run's seal (and how many more do), unless
            ``trust_modified``.
    """
    run = Path(run)
    if not (run / SEAL).is_file():
        log.warning("%s: no %s (a run written before runs were sealed): its files cannot be verified", run, SEAL)
        return {"status": "unsealed"}
    result = verify(run)
    if not result.problems:
        return {"status": "verified", "files": result.checked}
    problems = [str(problem) for problem in result.problems]
    if not trust_modified:
        more = f" (and {len(problems) - 1} more file(s): workbench verify {run})" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}; pass {TRUST_FLAG} to use it anyway")
    for problem in problems:
        log.warning("%s; used anyway (%s)", problem, TRUST_FLAG)
    return {"status": f"modified, used with {TRUST_FLAG}", "problems": problems}


def run_folder_above(path: str | Path) -> Path | None:
    """The run or comparison folder that holds ``path`` (itself or a folder above it), None when there is none: a
    folder with a workbench ``seal.json``, or a run's ``config.yaml`` beside its ``metrics.json``, ``adapter.json``,
    ``results/`` or ``checkpoints/`` (an unsealed or unfinished run), or a comparison's ``spec.json`` beside
    ``cells/``."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        if (folder / SEAL).is_file():
            try:
                _read_seal(folder / SEAL)
                return folder
            except ValueError:
                pass
        if (folder / "config.yaml").is_file() and any(
            (folder / name).exists() for name in ("metrics.json", "adapter.json", "results", "checkpoints")
        ):
            return folder
        if (folder / "spec.json").is_file() and (folder / "cells").is_dir():
            return folder
    return None
