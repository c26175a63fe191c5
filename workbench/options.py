"""Options that a task or a method adds to ``workbench adapt`` (``--rank``, ...) or a task to ``data generate``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from workbench.errors import UserError


@dataclass(frozen=True)
class Option:
    """One named option: ``--name`` on the command line, ``name=`` in Python."""

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: Sequence[Any] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def resolve_options(owner: str, declared: Sequence[Option], given: dict[str, Any]) -> dict[str, Any]:
    """Every declared option's value (given or default); an undeclared name is a `UserError`."""
    known = {option.name: option for option in declared}
    unknown = set(given) - set(known)
    if unknown:
        raise UserError(f"{owner} has no option(s) {sorted(unknown)}; it takes {sorted(known) or 'none'}")
    for name, value in given.items():
        choices = known[name].choices
        if choices is not None and value not in choices:
            raise UserError(f"{owner}: option {known[name].flag} must be one of {list(choices)}, got {value!r}")
    return {name: given.get(name, option.default) for name, option in known.items()}
