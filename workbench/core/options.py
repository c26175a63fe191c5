"""Options that a task or a method adds to ``workbench adapt`` (``--rank``, ...) or a task to ``data generate``.

A choice may hold only beside other options' values (`Option.requires`: ``--scaling X`` only with ``--init X``),
and an owner may decline a value a related owner takes, saying what to use instead (`Option.refused`);
`resolve_options` refuses both in the user's words, and ``--help`` offers only what holds. A renamed option keeps
its earlier name working for one minor version, with a `FutureWarning` (`Option.renamed_from`, `renamed`).
"""

from __future__ import annotations

import importlib.metadata
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, NamedTuple, Sequence

from workbench.core.errors import UserError


class RenamedFrom(NamedTuple):
    """An earlier name of an option or setting, and the version that renamed it (``("scaling", "0.1")``): the earlier
    name keeps working, with a `FutureWarning`, through the next minor version (0.2.x), and stops in `removed_in`."""

    name: str
    since: str

    @property
    def removed_in(self) -> str:
        major, minor = self.since.split(".")[:2]
        return f"{major}.{int(minor) + 2}"

    def accepted(self, version: str | None = None) -> bool:
        """Whether the earlier name still works in ``version`` (default: the installed workbench's)."""
        return _minor(version or importlib.metadata.version("sciadapt-workbench")) < _minor(self.removed_in)

    def notice(self, old: str, new: str) -> str:
        """The one-line warning for the earlier name said as ``old`` (``--scaling``), the current one as ``new``."""
        return f"{old} was renamed {new} in {self.since}; {old} stops working in {self.removed_in}: use {new}"


def _minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as "0.1.0"."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True)
class Option:
    """One named option: ``--name`` on the command line, ``name=`` in Python."""

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: Sequence[Any] | None = None
    #: Values that hold only beside other options' values: value -> {other option's name: the values it may take}
    #: (``{"goat": {"init": ("goat",)}}``).
    requires: Mapping[Any, Mapping[str, Sequence[Any]]] = field(default_factory=dict)
    #: Values this owner does not take though a related one does: value -> what to use instead.
    refused: Mapping[Any, str] = field(default_factory=dict)
    #: (earlier name, version that renamed it): the earlier name still works for a while (`RenamedFrom`).
    renamed_from: RenamedFrom | tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.renamed_from is not None:
            object.__setattr__(self, "renamed_from", RenamedFrom(*self.renamed_from))

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def said(self, value: Any) -> str:
        """``value`` of this option as a command line says it: ``--init goat``, ``--dora``, ``no --dora``."""
        if self.type is bool:
            return self.flag if value else f"no {self.flag}"
        return f"{self.flag} {value}"


def _either(texts: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} or {texts[-1]}"


def needs(declared: Sequence[Option], option: Option, value: Any, only: Collection[str] | None = None) -> str:
    """What ``value`` of ``option`` needs of the other options (those named in ``only``: None for all), in flags
    (``--init a, b or c``)."""
    known = {o.name: o for o in declared}
    parts = []
    for name, allowed in option.requires.get(value, {}).items():
        other = known[name]
        if only is not None and name not in only:
            continue
        said = [other.said(v) for v in allowed]
        parts.append(_either(said) if other.type is bool else f"{other.flag} {_either([str(v) for v in allowed])}")
    return " and ".join(parts)


def holds(option: Option, value: Any, values: Mapping[str, Any]) -> bool:
    """Whether ``value`` of ``option`` holds beside the other options' ``values`` (`Option.requires`)."""
    return all(values[name] in allowed for name, allowed in option.requires.get(value, {}).items())


def offered(option: Option, values: Mapping[str, Any]) -> list[Any]:
    """The choices of ``option`` that hold beside the other options' ``values`` (what ``--help`` lists)."""
    return [choice for choice in option.choices or () if holds(option, choice, values)]


def conditions(declared: Sequence[Option], option: Option, values: Mapping[str, Any]) -> list[str]:
    """What ``--help`` says of ``option``'s values that hold only beside some values of other options: "with --init
    X: also X" for one that does not hold beside ``values``, "--switch only with --init a, b or c" for one that does;
    requirements every choice of the other option meets are left unsaid."""
    known = {o.name: o for o in declared}
    texts = []
    for value, required in option.requires.items():
        binding = [name for name, allowed in required.items() if not _always(known[name], allowed)]
        if not binding:
            continue
        said = str(value) if option.type is not bool else option.said(value)
        if holds(option, value, values):
            texts.append(f"{said} only with {needs(declared, option, value, binding)}")
        else:
            texts.append(f"with {needs(declared, option, value, binding)}: also {said}")
    return texts


def _always(option: Option, allowed: Sequence[Any]) -> bool:
    """Whether every value ``option`` can take (its choices, a switch's both) is among ``allowed``."""
    every = (False, True) if option.type is bool else option.choices
    return every is not None and set(every) <= set(allowed)


def resolve_options(owner: str, declared: Sequence[Option], given: dict[str, Any]) -> dict[str, Any]:
    """Every declared option's value (given or default); a `UserError` naming the fix for an undeclared name, a value
    outside the choices, one the owner refuses (`Option.refused`) or one that does not hold beside the others
    (`Option.requires`)."""
    known = {option.name: option for option in declared}
    given = renamed(owner, declared, given)
    unknown = set(given) - set(known)
    if unknown:
        raise UserError(f"{owner} has no option(s) {sorted(unknown)}; it takes {sorted(known) or 'none'}")
    for name, value in given.items():
        option = known[name]
        if _hashable(value) and value in option.refused:
            choices = [str(c) for c in option.choices or ()]
            offered = f"; {owner} takes {option.flag} {_either(choices)}" if choices else ""
            raise UserError(f"{owner}: {option.said(value)} is not offered: {option.refused[value]}{offered}")
        if option.choices is not None and value not in option.choices:
            raise UserError(f"{owner}: option {option.flag} must be one of {list(option.choices)}, got {value!r}")
    values = {name: given.get(name, option.default) for name, option in known.items()}
    for option in declared:
        value = values[option.name]
        if _hashable(value) and not holds(option, value, values):
            unmet = [name for name, allowed in option.requires[value].items() if values[name] not in allowed]
            got = ", ".join(known[name].said(values[name]) for name in unmet)
            fix = f"give {needs(declared, option, value, unmet)}"
            others = [str(c) for c in option.choices or () if c != value and holds(option, c, values)]
            if option.type is bool and value:
                fix += f", or leave out {option.flag}"
            elif others:
                fix += f", or use {option.flag} {_either(others)}"
            raise UserError(f"{owner}: {option.said(value)} needs {needs(declared, option, value)} (got {got}): {fix}")
    return values


def renamed(owner: str, declared: Sequence[Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (name -> value) with every earlier name of a ``declared`` option or setting (``renamed_from``) still
    accepted replaced by its current name, with a one-line `FutureWarning` each. A name some declaration holds now
    stays its; an earlier name past its `RenamedFrom.removed_in` is left for the caller to refuse as unknown."""
    current = {o.name for o in declared}
    earlier = {o.renamed_from.name: o for o in declared if o.renamed_from and o.renamed_from.accepted()}
    result = {}
    for name, value in given.items():
        option = earlier.get(name)
        if option is None or name in current:
            result[name] = value
            continue
        if option.name in given:
            raise UserError(f"{owner}: {name!r} is the earlier name of {option.name!r}: give {option.name!r} only")
        warnings.warn(f"{owner}: {option.renamed_from.notice(repr(name), repr(option.name))}", FutureWarning,
                      stacklevel=3)  # fmt: skip
        result[option.name] = value
    return result


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
