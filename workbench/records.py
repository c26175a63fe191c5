"""Per-record problems of a reader: a bad file is reported with what is wrong, then skipped or raised, never
silently dropped or zero-filled. One policy for every task (``--on-bad-record skip|raise``, `ON_BAD_RECORD`): a
skipped record is warned about on the console, counted in the run's table and listed in ``metrics.json`` and
``report.md``; ``raise`` stops before the run directory appears (exit code 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from workbench.errors import UserError
from workbench.options import Option

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
