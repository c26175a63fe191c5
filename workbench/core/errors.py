"""Errors that are the user's to fix.

A `UserError` carries a message that names the file, the field and what was expected; the CLI prints it
without a traceback and exits with code 2. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path


class UserError(Exception):
    """Bad input (a file, a field, an option): the message says what is wrong and how to fix it."""


def field_error(path: str | Path, field: str, expected: str, found: str) -> UserError:
    """A `UserError` about one field of one file: ``FILE: field 'F': expected X, found Y``."""
    return UserError(f"{path}: field '{field}': expected {expected}, found {found}")


#: ``errno`` values of a write that the user can fix: no space, a read-only file system, no permission, a quota.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT})


#: What a `DiskError` asks of the user, by ``errno`` (the others: permissions).
_DISK_FIXES = {
    errno.ENOSPC: "free some space there (or write elsewhere)",
    errno.EDQUOT: "free some space there (or write elsewhere)",
    errno.EROFS: "write elsewhere (that file system is read-only)",
}


class DiskError(UserError):
    """A file could not be written or created for a reason of its disk (full, read-only, not permitted)."""


def disk_error(error: BaseException, path: str | Path | None = None) -> DiskError | None:
    """A `DiskError` naming ``path`` (else the file ``error`` names) when ``error``, or an error it arose from, is one
    of `DISK_ERRNOS` (an `OSError`, or a library's error that quotes the system's, as safetensors' "(os error 28)");
    None for any other error, and for a `UserError` (already said in words)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen and not isinstance(cause, UserError):
        seen.add(id(cause))
        code = cause.errno if isinstance(cause, OSError) else None
        if code is None:
            found = re.search(r"\(os error (\d+)\)", str(cause))
            code = int(found.group(1)) if found else None
        if code in DISK_ERRNOS:
            where = path or (cause.filename if isinstance(cause, OSError) and cause.filename else None) or "a file"
            return DiskError(f"{where}: {os.strerror(code)}; {_DISK_FIXES.get(code, 'give this user access to it')}, "
                             "then run the command again")  # fmt: skip
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return None
