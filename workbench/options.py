"""Options that a task or a method adds to ``workbench adapt`` (``--rank``, ...) or a task to ``data generate``.

A choice may hold only beside other options' values (`Option.requires`: ``--scaling X`` only with ``--init X``),
and an owner may decline a value a related owner takes, saying what to use instead (`Option.refused`);
`resolve_options` refuses both in the user's words, and ``--help`` offers only what holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

from workbench.errors import UserError


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


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
