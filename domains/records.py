"""Per-record problems of a reader: a bad file is reported with what is wrong, then skipped or raised, never
silently dropped or zero-filled. Shared by the readers of every domain that reads folders of records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from workbench.errors import UserError


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
    """The records a reader skipped, as (record, problem) pairs, in reading order."""

    problems: list[RecordProblem] = field(default_factory=list)

    def add(self, record: str | Path, problem: str) -> None:
        self.problems.append(RecordProblem(str(record), problem))

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
        lines = [f"{len(self.problems)} record(s) skipped:"] + [f"  {item}" for item in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more")
        return "\n".join(lines)
