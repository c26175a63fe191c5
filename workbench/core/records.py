"""Per-record problems of a reader: a bad file is reported with what is wrong, then skipped or raised, never
silently dropped or zero-filled. One policy for every task (``--on-bad-record skip|raise``, `ON_BAD_RECORD`): a
skipped record is warned about on the console, counted in the run's table and listed in ``metrics.json`` and
``report.md``; ``raise`` stops before the run directory appears (exit code 2). A reader applies it record by record
through a `Collector`.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from workbench.core.errors import UserError
from workbench.core.options import Option
from workbench.core.paths import PathOutsideData

log = logging.getLogger(__name__)

#: The bad-record policy every task takes (``--on-bad-record``).
ON_BAD_RECORD = Option(
    "on_bad_record",
    str,
    "skip",
    "a bad record (unreadable, truncated, mislabelled, ...): 'skip' warns, counts and lists it; 'raise' stops with "
    "exit code 2 before the run directory appears",
    choices=("skip", "raise"),
)


@dataclass(frozen=True)
class RecordProblem:
    """One bad record: which file, what is wrong."""

    record: str
    problem: str

    def __str__(self) -> str:
        return f"{self.record}: {self.problem}"


class BadRecordError(UserError):
    """A record that cannot be used; ``record`` names its file, ``problem`` says what is wrong."""

    def __init__(self, record: str | Path, problem: str):
        super().__init__(f"{record}: {problem}")
        self.record = str(record)
        self.problem = problem


@dataclass
class SkipReport:
    """The records a reader skipped, as (record, problem) pairs, in reading order, and how many records it looked at
    (``seen``: the M of "N of M records skipped"; 0 when the reader does not count)."""

    problems: list[RecordProblem] = field(default_factory=list)
    seen: int = 0

    def add(self, record: str | Path, problem: str) -> None:
        self.problems.append(RecordProblem(str(record), problem))

    def extend(self, other: "SkipReport") -> None:
        """Add another reader's skipped records and count."""
        self.problems.extend(other.problems)
        self.seen += other.seen

    def headline(self) -> str:
        """"N of M records skipped" (or "N records skipped" when nothing was counted)."""
        of = f" of {self.seen}" if self.seen else ""
        return f"{len(self.problems)}{of} record(s) skipped"

    def to_json(self) -> dict:
        return {
            "skipped": len(self.problems),
            "seen": self.seen,
            "records": [{"record": item.record, "problem": item.problem} for item in self.problems],
        }

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self) -> Iterator[RecordProblem]:
        return iter(self.problems)

    @property
    def records(self) -> list[str]:
        return [item.record for item in self.problems]

    def summary(self, limit: int = 5) -> str:
        """One line per skipped record (the first ``limit``), or "no record skipped"."""
        if not self.problems:
            return "no record skipped"
        lines = [f"{self.headline()}:"] + [f"  {item}" for item in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more")
        return "\n".join(lines)


class Collector:
    """A reader's pass over its records in reading order: each record is read inside `record`, and a bad one is
    skipped (warned about and listed in ``skipped``) or raised, as ``on_error`` (``"skip"`` or ``"raise"``) says.

    A reader keeps what it reads through a subclass (its records, windows, ...). A skipped record is listed under
    ``report_by``: ``"record"`` the path given to `record` (a record of several files under its main file), ``"file"``
    the file its `BadRecordError` names (a record's header or one of its data files).
    """

    def __init__(self, on_error: str, *, report_by: str = "record"):
        self.on_error = on_error
        self.report_by = report_by
        self.skipped = SkipReport()

    @contextmanager
    def record(self, path: str | Path, *, where: str = ""):
        """Run the body for one record (counted in ``skipped.seen``). A `UserError` raised inside skips the record or
        is raised, with ``where`` (a table row, ...) appended to its problem; a `PathOutsideData` is always raised (a
        data set that names files outside itself is refused as a whole)."""
        self.skipped.seen += 1
        try:
            yield
        except PathOutsideData:
            raise
        except UserError as error:
            bad = isinstance(error, BadRecordError)
            record = error.record if bad and self.report_by == "file" else str(path)
            problem = error.problem if bad else str(error)
            if problem.startswith(f"{path}: "):
                problem = problem[len(f"{path}: ") :]
            if where:
                problem = f"{problem} ({where})"
            if self.on_error == "raise":
                if where:
                    raise BadRecordError(record, problem) from None
                raise
            log.warning("skipping %s: %s", record, problem)
            self.skipped.add(record, problem)
