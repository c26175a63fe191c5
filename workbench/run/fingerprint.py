"""What a run's numbers depend on, as hashes: the data it reads and the settings it was given.

A run records both when it starts (``fingerprint.json``, `workbench.run`), and a compared cell records them in its
manifest (`workbench.comparison.cells.cell_manifest`); ``--resume`` and a rerun of ``workbench compare`` refuse to
continue on other data or other settings. One floor below `workbench.run` and `workbench.comparison`, which both use it.

`data_fingerprint` is the sha256 of every file the run reads (names and bytes), `settings_hash` that of a resolved
configuration. Each file's digest is kept for the life of the process, keyed by its path, size, inode and times, so
that the cells of a comparison hash their shared data once (a file changed less than `RACY_SECONDS` ago is hashed
again every time, as git does).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping

from workbench.core.seal import sha256_file

#: A file modified less than this long ago may change again within its file system's time resolution: its digest
#: is not kept [s].
RACY_SECONDS = 2.0
#: Most files whose digests a run's ``fingerprint.json`` lists one by one (to name a changed file); a larger data
#: set keeps only its fingerprint.
LISTED_FILES = 1000

_digests: dict[tuple[str, int, int, int, int], str] = {}


def data_source(data: str | Path | None, domain: str, task_options: Mapping[str, Any], seed: int) -> Path | str:
    """What a run of task ``domain`` reads: the file or folder ``data``; without it, the task's default data
    (`workbench.core.task.Task.default_data` with ``task_options`` and ``seed``): its embedded files, or a text naming
    its generator, options and seed. A ``data`` that names no file is the text it is (the task refuses it)."""
    if data is None:
        from workbench.core.registry import tasks

        return tasks.get(domain)(**task_options).default_data(seed)
    path = Path(data)
    return path if path.exists() else str(data)


def file_digests(source: Path | str) -> dict[str, str] | None:
    """sha256 (hex) of every file of ``source`` by its name (a folder: the path relative to it, in sorted order; a
    file: its name); None for a text source."""
    if isinstance(source, str):
        return None
    files = sorted(path for path in source.rglob("*") if path.is_file()) if source.is_dir() else [source]
    return {
        (path.relative_to(source) if source.is_dir() else Path(path.name)).as_posix(): _file_digest(path)
        for path in files
    }


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
    if key in _digests:
        return _digests[key]
    digest = sha256_file(path)
    if time.time() - stat.st_mtime > RACY_SECONDS:
        _digests[key] = digest
    return digest


def combined(source: Path | str, digests: Mapping[str, str] | None) -> str:
    """The data fingerprint of ``source`` from its `file_digests` (or its text)."""
    digest = hashlib.sha256()
    if digests is None:
        digest.update(str(source).encode())
        return digest.hexdigest()
    for name, content in digests.items():
        digest.update(name.encode() + b"\0" + bytes.fromhex(content))
    return digest.hexdigest()


def data_fingerprint(data: str | Path | None, domain: str, task_options: Mapping[str, Any], seed: int) -> str:
    """sha256 (hex) of the data a run of task ``domain`` reads (`data_source`): every file's name and the sha256 of
    its bytes, in sorted order, wherever the folder lies; for a text source (generated data), the text."""
    source = data_source(data, domain, task_options, seed)
    return combined(source, file_digests(source))


def settings_hash(settings: Mapping[str, Any]) -> str:
    """sha256 (hex) of ``settings`` as canonical JSON."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def data_record(data: str | Path | None, domain: str, task_options: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """What a run records of its data when it starts (in ``fingerprint.json``, beside its ``settings_hash``):
    ``data_fingerprint``, ``data_source`` (`data_source`, as text) and the digest of every file (``data_files``;
    None for generated data or more than `LISTED_FILES` files)."""
    source = data_source(data, domain, task_options, seed)
    digests = file_digests(source)
    return {
        "data_fingerprint": combined(source, digests),
        "data_source": str(source),
        "data_files": digests if digests is not None and len(digests) <= LISTED_FILES else None,
    }


def data_changes(before: Mapping[str, Any], now: Mapping[str, Any], shown: int = 3) -> str:
    """What differs between two `run_fingerprint` records' data, in words: the files changed, added and removed
    (the first ``shown`` of each), else the sources."""
    old, new = before.get("data_files"), now.get("data_files")
    if isinstance(old, dict) and isinstance(new, dict):
        parts = []
        for what, names in (
            ("changed", [name for name in new if name in old and old[name] != new[name]]),
            ("added", [name for name in new if name not in old]),
            ("removed", [name for name in old if name not in new]),
        ):
            if names:
                listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
                parts.append(f"{what}: {listed}")
        if parts:
            return "; ".join(parts)
    if before.get("data_source") != now.get("data_source"):
        return f"was {before.get('data_source')}, now {now.get('data_source')}"
    return f"the files of {now.get('data_source')} differ"

