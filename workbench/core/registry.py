"""Registries of tasks, models and methods, open to third parties through entry points.

A plug-in module registers its class with a decorator::

    @methods.register
    class MyMethod(Method):
        name = "my-method"
        description = "One line shown by `workbench list`."

and is found through its distribution's entry points (``[project.entry-points."workbench.methods"]
my-method = "my_package.my_method"``). The workbench's own plug-ins are declared the same way in its
``pyproject.toml``, so there is one mechanism for both.
"""

from __future__ import annotations

import difflib
import logging
from importlib import import_module
from importlib.metadata import entry_points
from typing import Generic, Sequence, TypeVar

from workbench.core.errors import UserError

log = logging.getLogger(__name__)
T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Name -> class for one plug-in kind; names are unique (a second registration is an error)."""

    def __init__(self, kind: str, group: str):
        self.kind = kind
        self.group = group
        self._classes: dict[str, T] = {}
        #: Plug-ins whose module could not be imported (an extra not installed): name -> the error.
        self.unavailable: dict[str, str] = {}
        self._discovered = False

    def register(self, cls: T) -> T:
        """Class decorator: registers ``cls`` under ``cls.name``."""
        name = cls.name
        if name in self._classes and self._classes[name] is not cls:
            raise ValueError(
                f"{self.kind} '{name}' is registered twice: {self._classes[name].__module__} and {cls.__module__}"
            )
        self._classes[name] = cls
        return cls

    def _discover(self, name: str | None = None) -> None:
        """Import the plug-in modules of every entry point, or only those of the entry points called ``name``
        (what one command needs: a run on one task does not pay for every other domain's libraries)."""
        if self._discovered:
            return
        self._discovered = name is None
        for entry in entry_points(group=self.group):
            if name is not None and entry.name != name:
                continue
            try:
                import_module(entry.value.split(":")[0])
            except ImportError as error:  # a package of an extra that is not installed: say so when it is asked for
                self.unavailable[entry.name] = f"{type(error).__name__}: {error}"
            except Exception as error:  # a broken third-party plug-in must not break the others
                self.unavailable[entry.name] = f"{type(error).__name__}: {error}"
                log.warning("could not load %s plug-in '%s' (%s): %s", self.kind, entry.name, entry.value, error)

    def declared(self) -> list[str]:
        """Every name of this kind, read from the entry points, the classes registered so far and the plug-ins that
        could not be loaded, without importing a plug-in (what refuses a mistyped name at once)."""
        entries = {entry.name for entry in entry_points(group=self.group)}
        return sorted(entries | set(self._classes) | set(self.unavailable))

    def module_of(self, name: str) -> str | None:
        """The module the entry point ``name`` names (None: no entry point of that name)."""
        return next((e.value.split(":")[0] for e in entry_points(group=self.group) if e.name == name), None)

    def unknown(self, name: str, known: Sequence[str] | None = None) -> str:
        """The message refusing ``name``: the closest of ``known`` (default: every declared name), then all of them."""
        known = self.declared() if known is None else list(known)
        close = difflib.get_close_matches(name, known, n=1)
        guess = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown {self.kind} '{name}'{guess}; known: {', '.join(known)}"

    def get(self, name: str) -> T:
        """The class registered as ``name``; a name no entry point declares is a `UserError` naming the closest
        one, before any plug-in is imported."""
        if name not in self._classes and name not in self.declared():
            raise UserError(self.unknown(name))
        if name not in self._classes:
            self._discover(name)  # its own entry point first
        if name not in self._classes and name not in self.unavailable:
            self._discover()
        if name not in self._classes and name in self.unavailable:
            why = self.unavailable[name]
            extra = extra_of(why, self.module_of(name))
            hint = f"install it: {install_command(extra)}" if extra else "install the extra that provides it"
            raise UserError(f"{self.kind} '{name}' cannot be loaded ({why}); {hint}")
        try:
            return self._classes[name]
        except KeyError:  # an entry point whose module registers no class of that name
            raise UserError(self.unknown(name, self.names())) from None

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._classes)

    def items(self) -> list[tuple[str, T]]:
        return [(name, self._classes[name]) for name in self.names()]


#: The distribution whose extras install the optional libraries (pyproject.toml).
DISTRIBUTION = "sciadapt-workbench"


#: Entry-point group of the roles the engine fills with a plug-in: ``role = "module:Class"`` (a registered class).
ROLES = "workbench.roles"


def role(name: str) -> str:
    """The registered name of the plug-in an installed distribution names for the engine's role ``name`` (entry
    point group `ROLES`; ``density-ratio``: the method whose estimator weighs conformal calibration items). Loads
    that plug-in's module only. A `UserError` when no installed distribution fills the role."""
    for entry in entry_points(group=ROLES):
        if entry.name == name:
            return entry.load().name
    raise UserError(f"no installed plug-in fills the role '{name}' (entry point group {ROLES})")


def install_command(extra: str) -> str:
    """The command that installs this distribution's extra ``extra``."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'


#: Import names of optional libraries that differ from the name pip installs them by (an import error names the
#: module; the install command needs the distribution).
DISTRIBUTION_OF_MODULE = {"sklearn": "scikit-learn", "ot": "pot", "PIL": "pillow", "yaml": "pyyaml"}


def missing_distribution(error: str) -> str | None:
    """The pip name of the module an import error says is missing (``No module named 'sklearn'`` ->
    ``scikit-learn``); None when the error names no missing module."""
    import re

    missing = re.search(r"No module named '([^'.]+)", error)
    return None if missing is None else distribution_of(missing.group(1))


def distribution_of(module: str) -> str:
    """The pip name of the top-level module ``module`` (``sklearn`` -> ``scikit-learn``, ``my_module`` ->
    ``my-module``)."""
    return DISTRIBUTION_OF_MODULE.get(module, module).lower().replace("_", "-")


def extra_of(error: str, module: str | None = None) -> str | None:
    """The extra of this distribution that installs the module an import error names (None: not a missing
    module, or none of the extras installs it); of several, the one named in the dotted path of the plug-in
    ``module`` that failed (``workbench.domains.DOMAIN.task`` -> the extra named DOMAIN), else the first."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    package = missing_distribution(error)
    if package is None:
        return None
    try:
        requirements = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return None
    extras = []
    for requirement in requirements:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        extra = re.search(r"""extra == ['"]([^'"]+)""", requirement)
        if extra and (name == package or name.startswith(package + "-")):
            extras.append(extra.group(1))
    named = [extra for extra in extras if extra in (module or "").split(".")]
    return (named or extras or [None])[0]


tasks: Registry = Registry("task", "workbench.tasks")
models: Registry = Registry("model", "workbench.models")
methods: Registry = Registry("method", "workbench.methods")
