"""What a prediction request brings, put into a fresh folder of its own, and the hash that names it.

A request brings its record either as uploaded files (multipart) or as a path inside the server's intake folder.
Either way the bytes are copied once into a new folder for this request (the model reads that copy: what was hashed
is what is read), under checked names:

- an uploaded file's name is reduced to its last part and must then be a plain name (letters, digits, ``._-``, not
  starting with a dot, at most 128 characters) that no other file of the request has;
- an intake path is relative, has no ``..`` part, and no part of it is a symbolic link; it names a file (taken with
  the files beside it that share its stem: a record's header and signal) or a folder (its plain files). It must
  resolve inside the intake folder (`workbench.core.paths.confined`).

The request's input hash (`input_sha256`) is the sha256 of its manifest: one ``<sha256 of the file>  <name>`` line
per file, sorted by name, each ending in a newline (the lines ``sha256sum`` prints), so a caller can compute it
from the files it sent.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO, Mapping

from workbench.core.errors import UserError
from workbench.core.paths import PathOutsideData, confined

_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


class Refused(UserError):
    """A request refused before the model sees it: ``status`` (the HTTP code) and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def input_sha256(digests: Mapping[str, str]) -> str:
    """The request's input hash from ``{file name: sha256 of its bytes}`` (the module's docstring)."""
    manifest = "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))
    return hashlib.sha256(manifest.encode()).hexdigest()


def safe_name(name: str | None) -> str:
    """An uploaded file's name as stored: its last path part, checked.

    Raises:
        Refused: 400 when nothing usable remains.
    """
    base = re.split(r"[\\/]", name or "")[-1].strip()
    if not _NAME.match(base) or base in (".", ".."):
        raise Refused(400, f"upload file name {name!r}: expected a plain file name (letters, digits, '._-', not "
                           "starting with a dot, at most 128 characters)")  # fmt: skip
    return base


class RequestFolder:
    """The files of one request, written into ``folder`` (an empty folder of its own) within ``max_bytes`` and
    ``max_files``; ``digests`` holds each file's sha256."""

    def __init__(self, folder: Path, max_bytes: int, max_files: int):
        self.folder, self.max_bytes, self.max_files = folder, max_bytes, max_files
        self.digests: dict[str, str] = {}
        self._bytes = 0

    def add(self, name: str, source: BinaryIO) -> None:
        """Copy ``source`` (read to its end) to the file ``name`` (already `safe_name`-d) of the folder.

        Raises:
            Refused: 400 for a name given twice, 413 past the file-count or byte limit.
        """
        if name in self.digests:
            raise Refused(400, f"upload file name {name!r} given twice")
        if len(self.digests) >= self.max_files:
            raise Refused(413, f"more than {self.max_files} files in one request")
        digest = hashlib.sha256()
        with open(self.folder / name, "xb") as out:
            for chunk in iter(lambda: source.read(_CHUNK), b""):
                self._bytes += len(chunk)
                if self._bytes > self.max_bytes:
                    raise Refused(413, f"request above this server's limit of {self.max_bytes / 2**20:g} MiB "
                                       "(--max-request-mb)")  # fmt: skip
                digest.update(chunk)
                out.write(chunk)
        self.digests[name] = digest.hexdigest()

    def add_text(self, name: str, text: str) -> None:
        """A form field's text as the file ``name`` (UTF-8)."""
        self.add(name, io.BytesIO(text.encode()))

    @property
    def sha256(self) -> str:
        return input_sha256(self.digests)


def intake_files(intake: Path, relative: object) -> list[Path]:
    """The files an intake path names (the module's docstring), sorted.

    Raises:
        Refused: 400 for a path that is not a relative string inside ``intake`` without ``..`` or symbolic links,
            404 for one that names nothing.
    """
    if not isinstance(relative, str) or not relative.strip():
        raise Refused(400, "JSON body: field 'path': expected a path relative to the intake folder")
    if "\x00" in relative:
        raise Refused(400, f"path {relative!r}: a NUL character; expected a path relative to the intake folder")
    path = Path(relative)
    if path.is_absolute() or ".." in path.parts:
        raise Refused(400, f"path {relative!r}: expected a path relative to the intake folder, without '..'")
    current = intake
    for part in path.parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            raise Refused(404, f"path {relative!r}: not found in the intake folder") from None
        if stat.S_ISLNK(mode):
            raise Refused(400, f"path {relative!r}: {part!r} is a symbolic link; links are not followed")
    try:
        target = confined(path, intake, f"path {relative!r}")
    except PathOutsideData as error:
        raise Refused(400, error.problem) from None
    if target.is_dir():
        candidates = sorted(target.iterdir())
    elif target.is_file():
        candidates = sorted(p for p in target.parent.iterdir() if p.name.split(".")[0] == target.name.split(".")[0])
    else:
        raise Refused(400, f"path {relative!r}: not a file or folder")
    return [p for p in candidates if not p.name.startswith(".") and stat.S_ISREG(os.lstat(p).st_mode)]


def open_plain(path: Path) -> BinaryIO:
    """``path`` opened for reading without following a symbolic link at its last part."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")
