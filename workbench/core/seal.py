"""Sealed run folders: a signed manifest of every file a run (a comparison cell, a comparison) produced, and its check.

When a run finishes (`workbench.run.adapting.run_request`, after its log is closed) it writes ``seal.json``: for every
file it produced, the path relative to the folder, its sha256 and its size, signed with the workbench's ed25519 key
(`workbench.core.sealkeys`: ``--seal-key``, ``WORKBENCH_SEAL_KEY`` or ``$XDG_CONFIG_HOME/workbench/seal-key.pem``,
always outside every run folder). A comparison cell extends its run's seal with its record ``cell.json``
(`workbench.comparison.cells.run_cell`), and a comparison seals its own files when it writes its report. A run is
complete only once its seal verifies (`workbench.run.adapting.run_request` resumes one that has ``metrics.json`` but no
seal). Readers verify before use: `check_run` (``evaluate``, ``predict``, ``serve``, the card, `Run.load`: a teacher,
``compare --rerun-cell``), the report step of ``compare`` (every cell), `workbench.clinical.site_calibration.
check_layer` (a calibration layer: ``--calibration LAYER``) and ``workbench verify DIR`` (`verify`).

``seal.json`` (format 2)::

    {"format": "workbench-seal/2", "kind": "run" | "cell" | "grid-cell" | "comparison" | "calibration",
     "sealed": "<UTC time>",
     "workbench_version": "...", "required": ["adapter.json", ...],
     "files": {"adapter.safetensors": {"sha256": "<hex>", "bytes": 1652}, ...},
     "key_id": "<16 hex>", "public_key": "<base64, 32 bytes>", "signature": "<base64, 64 bytes>"}

The signature is ed25519 over the canonical JSON (sorted keys, separators ``,`` and ``:``) of every field but
``signature``. ``key_id`` is the first 16 hex digits of sha256 of the raw public key. What each kind must contain is
`REQUIRED`, fixed by this code, not by the seal (its ``required`` field only repeats it).

A seal verifies when it is readable and of format 2, its signature holds, its key is trusted (the key's own, or one
listed in ``$XDG_CONFIG_HOME/workbench/trusted-seal-keys``), it lists every file its kind requires, and every file it
lists is present with its size and sha256, and no file it covers was added after sealing. Anything else is a `Problem`:
a missing seal, a format 1 seal (unkeyed, written before seals were signed: anyone could rewrite it), a bad
signature, an untrusted key (named by its key_id, with the line that would trust it), a required file not listed, a
listed file missing or changed, a file added. ``--trust-modified`` lets a reader go on anyway; `check_run` then
returns the problems for the reader's record.

What a seal covers: every regular file below its folder, except hidden names (the lock ``.lock``, ``.owner.json``,
the temporary files of atomic writes: any path with a part starting with ``.``), ``seal.json`` itself and the files
of a subfolder that holds its own ``seal.json`` (a comparison's cells, a grid cell's runs: sealed by theirs, and
checked by `verify` in turn). Nothing is written into a sealed folder afterwards (``evaluate`` and ``predict`` write
outside every run).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

from workbench.core import sealkeys
from workbench.core.checkpoint import write_json
from workbench.core.errors import UserError

log = logging.getLogger("workbench")

#: The manifest's file name, in the folder it seals.
SEAL = "seal.json"
#: The manifest's format (its ``format`` field).
FORMAT = "workbench-seal/2"
#: The unkeyed format written before seals were signed (sha256 and size alone): read as a seal that cannot be verified.
UNKEYED_FORMAT = "workbench-seal/1"
#: What a reader is told to pass to use a folder whose files differ from its seal.
TRUST_FLAG = "--trust-modified"
#: The files a finished run always writes (`workbench.run.adapting`; report.md and plots only when it reports).
RUN_FILES = ("adapter.json", "adapter.safetensors", "config.yaml", "fingerprint.json", "log.txt", "metrics.json")
#: The files each kind of sealed folder must list, fixed here (a seal cannot drop one of them).
REQUIRED: dict[str, tuple[str, ...]] = {
    "run": RUN_FILES,
    "cell": (*RUN_FILES, "cell.json"),  # a cell of one learning rate: its run's folder and the record
    "grid-cell": ("cell.json",),  # a cell of a learning-rate grid: the record; each rate's run is sealed apart
    "comparison": ("comparison.json", "compute.json", "report.md", "spec.json"),
    # a clinical layer fitted on a site's records (`workbench.clinical.site_calibration`): outside every run
    "calibration": ("clinical.json", "clinical.npz", "layer.json", "reliability.png"),
}


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


def canonical(content: Mapping[str, Any]) -> bytes:
    """The bytes a seal's signature covers: its canonical JSON (sorted keys, compact), less ``signature``."""
    unsigned = {key: value for key, value in content.items() if key != "signature"}
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()


def _check_key_location() -> None:
    """The seal key is outside every run folder: a `UserError` naming the folder when not."""
    path = sealkeys.key_path()
    run = run_folder_above(path.parent)
    if run is not None:
        raise UserError(f"seal key {path}: inside the run folder {run}; a key beside what it seals proves nothing: "
                        f"keep it outside every run ({sealkeys.KEY_FLAG} PATH or {sealkeys.KEY_ENV})")  # fmt: skip


def seal(folder: str | Path, kind: str, pending: Mapping[str, bytes] | None = None, extend: bool = False) -> int:
    """Write ``folder/seal.json`` (atomically, signed) over the files it covers; returns how many.

    Args:
        folder: the finished run, cell or comparison.
        kind: a key of `REQUIRED` ("run", "cell", "grid-cell", "comparison", "calibration"): the files it must
            list.
        pending: files about to be written (relative path -> their bytes): sealed with the hash of those bytes, so
            that the seal never lags behind them (a cell's ``cell.json`` is written after its seal; a crash between
            the two leaves a seal naming a missing record, and the cell runs again).
        extend: the folder's existing seal (its run's) must still verify before it is extended: a file changed since
            then is a `UserError` naming it, never sealed anew.

    Raises:
        UserError: a required file of ``kind`` is missing (nothing is sealed), the seal key cannot be used, or (with
            ``extend``) the existing seal does not verify.
    """
    folder = Path(folder)
    pending = dict(pending or {})
    if extend and (folder / SEAL).is_file():
        problems = verify_seal(folder, ignore=set(pending))
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
    missing = [name for name in REQUIRED[kind] if name not in files]
    if missing:
        raise UserError(f"{folder}: a {kind} always holds {', '.join(missing)}; it is missing, so the folder is not "
                        "sealed (the run did not finish: resume it)")  # fmt: skip
    import workbench

    _check_key_location()
    content: dict[str, Any] = {
        "format": FORMAT, "kind": kind, "sealed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "workbench_version": workbench.__version__, "required": list(REQUIRED[kind]),
        "files": dict(sorted(files.items())),
    }  # fmt: skip
    key = sealkeys.signing_key()
    content["key_id"], content["public_key"] = sealkeys.public_parts(key)
    content["signature"] = sealkeys.sign(key, canonical(content))
    write_json(folder / SEAL, content)
    return len(files)


@dataclass(frozen=True)
class Problem:
    """One reason a folder does not verify (``path``: the file concerned; ``why``: in words, with the fix)."""

    path: Path
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def _is_seal(path: Path) -> bool:
    """Whether ``path`` holds a workbench seal of any format (a run folder's mark, verified or not)."""
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(content, dict) and str(content.get("format", "")).startswith("workbench-seal/")


def _read_seal(path: Path) -> dict[str, Any]:
    """The format 2 manifest in ``path``; a `ValueError` saying why when it is not one."""
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"not a readable seal ({error})") from None
    if isinstance(content, dict) and content.get("format") == UNKEYED_FORMAT:
        raise ValueError(f"an unkeyed seal written before seals were signed ({UNKEYED_FORMAT}): anyone could have "
                         "rewritten it, so its files cannot be verified; make the run again to seal it with a key")
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise ValueError(f"not a workbench seal (expected {{'format': '{FORMAT}', ...}})")
    if not isinstance(content.get("files"), dict) or content.get("kind") not in REQUIRED:
        raise ValueError(f"a damaged seal (its files are not an object, or its kind is not one of "
                         f"{', '.join(REQUIRED)})")  # fmt: skip
    if not all(isinstance(content.get(key), str) for key in ("key_id", "public_key", "signature")):
        raise ValueError("an unsigned seal (no key_id, public_key or signature): anyone could have written it")
    return content


#: When the files of each kind of sealed folder were sealed, in messages ("the file was changed ...").
_CHANGED = {
    "run": "after the run finished",
    "cell": "after the cell was recorded",
    "grid-cell": "after the cell was recorded",
    "comparison": "after the comparison was written",
    "calibration": "after the layer was fitted",
}


def _signature_problems(path: Path, content: Mapping[str, Any]) -> list[Problem]:
    """What is wrong with the signature of the manifest ``content`` read from ``path``: it does not hold, or its key
    is not trusted here (named by its key_id, with the line that would trust it)."""
    try:
        public = sealkeys.decode(content["public_key"], "public_key")
        signature = sealkeys.decode(content["signature"], "signature")
    except ValueError as error:
        return [Problem(path, f"a damaged seal ({error})")]
    if sealkeys.key_id(public) != content["key_id"] or not sealkeys.signature_holds(public, signature,
                                                                                      canonical(content)):
        return [Problem(path, f"its signature does not hold: {SEAL} was changed after it was signed")]
    _check_key_location()
    if content["key_id"] in sealkeys.trusted_keys():
        return []
    return [Problem(path, f"signed by key {content['key_id']}, which is not trusted here; if you trust whoever sealed "
                          f"it, add the line 'NAME {content['public_key']}' to {sealkeys.trusted_path()}")]  # fmt: skip


def _file_problems(folder: Path, content: Mapping[str, Any], ignore: set[str]) -> list[Problem]:
    """The files of ``folder`` that differ from its manifest ``content``: required ones not listed, listed ones missing
    or changed (size, then sha256), covered ones not listed (``ignore``: names about to be written)."""
    path, files = folder / SEAL, content["files"]
    changed = _CHANGED[content["kind"]]
    problems = [
        Problem(folder / name, f"not listed in {path}, though every {content['kind']} holds it (sealed incomplete)")
        for name in REQUIRED[content["kind"]] if name not in files and name not in ignore
    ]  # fmt: skip
    for name, entry in files.items():
        file = folder / name
        if name in ignore:
            continue
        if not isinstance(entry, dict) or not {"sha256", "bytes"} <= set(entry):
            problems.append(Problem(path, f"entry {name!r} is not {{'sha256', 'bytes'}}: the seal is damaged"))
        elif not file.is_file():
            problems.append(Problem(file, f"missing, though {path} lists it (removed {changed})"))
        elif file.stat().st_size != entry["bytes"]:
            problems.append(Problem(file, f"{file.stat().st_size} bytes, {path} says {entry['bytes']} (the file was "
                                          f"changed {changed})"))  # fmt: skip
        elif sha256_file(file) != entry["sha256"]:
            problems.append(Problem(file, f"sha256 differs from {path} (the file was changed {changed})"))
    for relative in _covered(folder):
        name = relative.as_posix()
        if name not in files and name not in ignore and name not in REQUIRED[content["kind"]]:  # those: said above
            problems.append(Problem(folder / relative, f"not listed in {path} (added {changed})"))
    return problems


def verify_seal(folder: Path, ignore: set[str] | frozenset[str] = frozenset()) -> list[Problem]:
    """Why ``folder/seal.json`` does not verify (see the module's docstring); empty when it does. ``ignore``: files
    about to be written, not checked."""
    path = folder / SEAL
    if not path.is_file():
        return [Problem(path, "missing: the folder was interrupted before it was sealed, or written before runs were "
                              "sealed, so its files cannot be verified")]  # fmt: skip
    try:
        content = _read_seal(path)
    except ValueError as error:
        return [Problem(path, str(error))]
    return _signature_problems(path, content) + _file_problems(folder, content, set(ignore))


def _should_be_sealed(folder: Path) -> bool:
    """Whether ``folder`` is what a finished run, cell, comparison or calibration layer leaves (and so should hold a
    seal)."""
    run = (folder / "config.yaml").is_file() and (folder / "metrics.json").is_file()
    layer = (folder / "layer.json").is_file() and (folder / "clinical.json").is_file()
    return run or layer or (folder / "cell.json").is_file() or (folder / "comparison.json").is_file()


@dataclass(frozen=True)
class Sealed:
    """One sealed folder that `verify` checked: its kind and key (None where its seal cannot be read), the files it
    lists, and its problems (none: verified)."""

    path: Path
    kind: str | None
    key_id: str | None
    files: int
    problems: tuple[Problem, ...]


@dataclass
class Verification:
    """What `verify` found below a folder."""

    #: Files checked against a seal (and found to match, less ``problems``).
    checked: int = 0
    #: Why the sealed folders below do not verify: changed or missing files, bad or untrusted seals.
    problems: list[Problem] = field(default_factory=list)
    #: Folders of finished-looking runs, cells or comparisons that hold no ``seal.json``: not complete (interrupted
    #: before they were sealed) or written before runs were sealed.
    unsealed: list[Path] = field(default_factory=list)
    #: Each folder holding a ``seal.json``, in the order visited.
    folders: list[Sealed] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unsealed


def verify(folder: str | Path) -> Verification:
    """Check ``folder`` (a run, a cell, a comparison) and every sealed or finished folder below it against their
    seals (`verify_seal`)."""
    folder = Path(folder)
    result = Verification()

    def visit(current: Path) -> None:
        if (current / SEAL).is_file():
            try:
                content = _read_seal(current / SEAL)
            except ValueError:
                content = {"files": {}}
            problems = verify_seal(current)
            result.problems += problems
            bad = {p.path for p in problems}
            result.checked += sum(1 for name in content["files"] if current / name not in bad)
            result.folders.append(Sealed(current, content.get("kind"), content.get("key_id"), len(content["files"]),
                                         tuple(problems)))  # fmt: skip
        elif _should_be_sealed(current):
            result.unsealed.append(current)
        for entry in sorted(current.iterdir()):
            if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
                visit(entry)

    visit(folder)
    return result


def check_run(run: str | Path, trust_modified: bool = False, fix: str = f"pass {TRUST_FLAG} to use it anyway"
              ) -> dict[str, Any]:  # fmt: skip
    """Verify the finished run ``run`` (and any sealed folder below it) before a reader uses it; what the reader
    records about it.

    Returns ``{"status": "verified", "files": N, "key_id": "<16 hex>"}``; with ``trust_modified``, for a run that does
    not verify, ``{"status": "modified, used with --trust-modified", "problems": ["<file>: <why>", ...]}`` (with a
    warning each).

    Raises:
        UserError: one line naming the first problem (and how many more there are) and ending with ``fix``, unless
            ``trust_modified``: a missing, unkeyed or damaged seal, a bad signature, an untrusted key, a file missing,
            changed or added.
    """
    run = Path(run)
    result = verify(run)
    problems = [str(problem) for problem in result.problems]
    problems += [str(verify_seal(folder)[0]) for folder in result.unsealed]
    if not (run / SEAL).is_file() and run not in result.unsealed:
        problems.insert(0, str(verify_seal(run)[0]))
    if not problems:
        return {"status": "verified", "files": result.checked, "key_id": result.folders[0].key_id}
    if not trust_modified:
        more = f" (and {len(problems) - 1} more: workbench verify {run})" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}; {fix}")
    for problem in problems:
        log.warning("%s; used anyway (%s)", problem, TRUST_FLAG)
    return {"status": f"modified, used with {TRUST_FLAG}", "problems": problems}


def run_folder_above(path: str | Path) -> Path | None:
    """The run or comparison folder that holds ``path`` (itself or a folder above it), None when there is none: a
    folder with a workbench ``seal.json`` (of any format), or a run's ``config.yaml`` beside its ``metrics.json``,
    ``adapter.json``, ``results/`` or ``checkpoints/`` (an unsealed or unfinished run), or a comparison's ``spec.json``
    beside ``cells/``."""
    path = Path(path).resolve()
    for folder in (path, *path.parents):
        if (folder / SEAL).is_file() and _is_seal(folder / SEAL):
            return folder
        if (folder / "config.yaml").is_file() and any(
            (folder / name).exists() for name in ("metrics.json", "adapter.json", "results", "checkpoints")
        ):
            return folder
        if (folder / "spec.json").is_file() and (folder / "cells").is_dir():
            return folder
    return None
