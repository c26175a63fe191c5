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

import logging
from importlib import import_module
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from workbench.errors import UserError

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

    def get(self, name: str) -> T:
        """The class registered as ``name``; an unknown name is a `UserError` listing the known ones."""
        if name not in self._classes:
            self._discover(name)  # its own entry point first
        if name not in self._classes and name not in self.unavailable:
            self._discover()
        if name not in self._classes and name in self.unavailable:
            why, extra = self.unavailable[name], extra_of(self.unavailable[name])
            hint = f"install it: {install_command(extra)}" if extra else "install the extra that provides it"
            raise UserError(f"{self.kind} '{name}' cannot be loaded ({why}); {hint}")
        try:
            return self._classes[name]
        except KeyError:
            raise UserError(f"unknown {self.kind} '{name}'; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._classes)

    def items(self) -> list[tuple[str, T]]:
        return [(name, self._classes[name]) for name in self.names()]


#: The distribution whose extras install the optional libraries (pyproject.toml).
DISTRIBUTION = "sciadapt-workbench"


def install_command(extra: str) -> str:
    """The command that installs this distribution's extra ``extra``."""
    return f'pip install "{DISTRIBUTION}[{extra}]"'


def extra_of(error: str) -> str | None:
    """The extra of this distribution that installs the module an import error names (None: not a missing
    module, or none of the extras installs it)."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    missing = re.search(r"No module named '([^'.]+)", error)
    if missing is None:
        return None
    try:
        requirements = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return None
    module = missing.group(1).lower().replace("_", "-")
    for requirement in requirements:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        extra = re.search(r"""extra == ['"]([^'"]+)""", requirement)
        if extra and (name == module or name.startswith(module + "-")):
            return extra.group(1)
    return None


tasks: Registry = Registry("task", "workbench.tasks")
models: Registry = Registry("model", "workbench.models")
methods: Registry = Registry("method", "workbench.methods")
