"""Paths named inside data files stay inside the data folder.

A manifest (a JSON record's image, a header's data file, a table's file column) names files relative to the
folder the user gave. Such a path that resolves outside that folder (``../../x.png``, an
absolute path, a symbolic link out) is refused with exit code 2 naming the record, unless the user passes
``--allow-paths-outside`` (`ALLOW_PATHS_OUTSIDE`, an option of every task). It is never a skippable bad record: a
data set that points outside itself is refused as a whole.
"""

from __future__ import annotations

from pathlib import Path

from workbench.core.errors import UserError
from workbench.core.options import Option

#: Every task's switch for data sets whose manifests name files outside the data folder (``--allow-paths-outside``).
ALLOW_PATHS_OUTSIDE = Option(
    "allow_paths_outside",
    bool,
    False,
    "read files that a record names outside the data folder (absolute paths, '..', links out); refused by default",
)


class PathOutsideData(UserError):
    """A record names a file outside the data folder: ``problem`` says which, and the message adds `HINT` (the
    command line replaces it where the command does not take the flag)."""

    HINT = "pass --allow-paths-outside to read it anyway"

    def __init__(self, problem: str):
        super().__init__(f"{problem}; {self.HINT}")
        self.problem = problem


def confined(named: str | Path, root: str | Path, record: str, allow: bool = False) -> Path:
    """The file ``named`` by ``record`` (relative to ``root``, or absolute), resolved; a `PathOutsideData` naming the
    record when it resolves outside ``root`` (links followed) and ``allow`` is False."""
    root = Path(root).resolve()
    path = (root / named).resolve()  # an absolute ``named`` replaces root
    if not allow and not path.is_relative_to(root):
        raise PathOutsideData(f"{record}: names '{named}', which lies outside the data folder {root}")
    return path
