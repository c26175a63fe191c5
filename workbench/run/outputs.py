"""Where ``workbench predict`` writes: an output location checked before anything is scored, never inside a run,
never replaced without ``--overwrite``, and a CSV with its JSON record written so that they are always a pair.

`check_output` runs before the model is loaded and any record is scored; `write_pair` writes the CSV and its record
(`recover_pair` first tidies what an interrupted earlier write of the same output left). Both run while the caller
holds the output's lock (`workbench.run.rundir.claim_file`), so no other process writes the pair meanwhile.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from workbench.core.errors import UserError
from workbench.core.seal import run_folder_above

#: Free space an output needs beyond its estimate [bytes] (the record, file-system slack).
SPARE_BYTES = 1 << 20


def record_path(output: Path) -> Path:
    """The JSON record written beside the CSV ``output`` (same name, ``.json``)."""
    return output.with_suffix(".json")


def check_location(output: Path) -> None:
    """What can be told about ``--output`` before anything is locked, read or scored: a ``.csv`` file name, not inside
    a run or comparison folder, not a folder, under folders (the nearest existing one writable).

    Raises:
        UserError: one line naming the output and what to change.
    """
    if output.suffix.lower() != ".csv":
        raise UserError(f"--output {output}: the output must be a .csv file")
    run = run_folder_above(output.parent)
    if run is not None:
        raise UserError(f"--output {output}: inside the run folder {run}; predictions are never written into a run "
                        "or comparison folder: choose an --output outside it")  # fmt: skip
    for path in (output, record_path(output)):
        if path.is_dir():
            raise UserError(f"--output {output}: {path} is a folder; give a .csv file name")
    existing = output.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--output {output}: {existing} is a file, not a folder")
    try:
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".workbench-probe-")
        os.close(handle)
        os.remove(probe)
    except OSError as error:
        raise UserError(f"--output {output}: cannot write in {existing} ({error.strerror}); choose a writable "
                        "folder") from None  # fmt: skip


def check_output(output: Path, overwrite: bool, estimate_bytes: int) -> None:
    """Under the output's lock, before scoring: an earlier pair is replaced only with ``overwrite``, and the folder has
    room for about ``estimate_bytes`` (plus `SPARE_BYTES`).

    Raises:
        UserError: one line naming the output and what to change.
    """
    recover_pair(output, record_path(output))
    existing = [path.name for path in (output, record_path(output)) if path.exists()]
    if existing and not overwrite:
        verb = "exists" if len(existing) == 1 else "exist"
        raise UserError(f"--output {output}: {' and '.join(existing)} already {verb} in {output.parent}; pass "
                        "--overwrite to replace the pair, or choose another --output")  # fmt: skip
    free, needed = shutil.disk_usage(output.parent).free, estimate_bytes + SPARE_BYTES
    if free < needed:
        raise UserError(f"--output {output}: {free / 2**20:.1f} MiB free in {output.parent}, the predictions need "
                        f"about {needed / 2**20:.1f} MiB; free some space or choose another --output")  # fmt: skip


def _write_temporary(path: Path, content: bytes) -> None:
    """``content`` into the new file ``path``, flushed to the disk (fsync)."""
    with open(path, "xb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (where the platform allows opening a folder)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _hidden(path: Path, token: str, kind: str) -> Path:
    """``.<name>.<token>.<kind>`` beside ``path``: a temporary ("tmp") or a set-aside earlier file ("old")."""
    return path.with_name(f".{path.name}.{token}.{kind}")


def write_pair(csv: Path, csv_content: bytes, record: Path, record_content: bytes) -> None:
    """Write ``csv`` and its ``record`` so that a reader never sees a CSV beside the record of another write.

    No order of two renames replaces two files at once, and either order alone can leave a mixed pair (renaming the
    record last leaves the new CSV beside the old record after a crash between the renames; renaming it first, the old
    CSV beside the new record). So the record is the commit point, and the earlier pair is moved aside first:

    1. both new files are written to hidden temporaries in the target folder (``.<name>.<token>.tmp``) and fsynced;
    2. the earlier record, then the earlier CSV, are renamed aside (``.<name>.<token>.old``);
    3. the new CSV is renamed into place, then the new record (the commit), and the folder is fsynced;
    4. the earlier files are removed.

    A failure at any step (a full disk, a read-only folder) undoes what was done: the earlier pair is back, nothing
    new appears, and a `UserError` says why. A crash (kill -9, power loss) leaves the visible files in one of: the
    earlier pair; the earlier CSV alone; neither; the new CSV alone; the new pair — never a CSV beside a record of
    another write — and the hidden files tell which step it reached: the next write of the same output
    (`recover_pair`, under the same lock) puts the earlier pair back, or keeps the new pair once its record is in
    place.
    """
    folder = csv.parent
    folder.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    temporary = {csv: _hidden(csv, token, "tmp"), record: _hidden(record, token, "tmp")}
    aside = {record: _hidden(record, token, "old"), csv: _hidden(csv, token, "old")}
    moved: list[Path] = []  # earlier files set aside
    placed: list[Path] = []  # new files in place
    try:
        _write_temporary(temporary[csv], csv_content)
        _write_temporary(temporary[record], record_content)
        for path in (record, csv):
            if path.exists():
                os.replace(path, aside[path])
                moved.append(path)
        for path in (csv, record):
            os.replace(temporary[path], path)
            placed.append(path)
        _fsync_folder(folder)
    except BaseException as error:
        for path in reversed(placed):
            path.unlink(missing_ok=True)
        for path in reversed(moved):
            os.replace(aside[path], path)
        for path in temporary.values():
            path.unlink(missing_ok=True)
        if isinstance(error, OSError):
            why = "no space left on the device" if error.errno == errno.ENOSPC else error.strerror or str(error)
            raise UserError(f"--output {csv}: cannot write the predictions ({why}); nothing was replaced") from None
        raise
    for path in moved:
        aside[path].unlink(missing_ok=True)
    _fsync_folder(folder)


def recover_pair(csv: Path, record: Path) -> None:
    """Tidy what an interrupted `write_pair` of ``csv`` and ``record`` left (its hidden files, one set per write).

    The new CSV's temporary is renamed before the new record's, and both exist before anything is moved aside. So
    while either temporary remains the record never came into place: the earlier pair is put back (a new CSV already
    in place goes); with both gone the write had committed and only the set-aside earlier files remain, which go.
    Call it under the output's lock."""
    folder = csv.parent
    if not folder.is_dir():
        return
    tokens = {
        path.name[len(prefix) :].rsplit(".", 1)[0]
        for prefix in (f".{csv.name}.", f".{record.name}.")
        for path in folder.glob(f"{prefix}*")
        if path.name.endswith((".tmp", ".old"))
    }
    for token in sorted(tokens):
        old_record, old_csv = _hidden(record, token, "old"), _hidden(csv, token, "old")
        new_csv, new_record = _hidden(csv, token, "tmp"), _hidden(record, token, "tmp")
        if new_csv.exists() or new_record.exists():  # the new record never came into place: undo
            if not new_csv.exists() and not old_csv.exists():  # a new CSV in place where there was none before
                csv.unlink(missing_ok=True)
            if old_csv.exists():
                os.replace(old_csv, csv)
            if old_record.exists():
                os.replace(old_record, record)
        for path in (old_record, old_csv, new_csv, new_record):
            path.unlink(missing_ok=True)
    if tokens:
        _fsync_folder(folder)
