"""Errors that are the user's to fix.

A `UserError` carries a message that names the file, the field and what was expected; the CLI prints it
without a traceback and exits with code 2. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """Bad input (a file, a field, an option): the message says what is wrong and how to fix it."""


def field_error(path: str | Path, field: str, expected: str, found: str) -> UserError:
    """A `UserError` about one field of one file: ``FILE: field 'F': expected X, found Y``."""
    return UserError(f"{path}: field '{field}': expected {expected}, found {found}")
