"""A package's names from the single module of 0.1 that it replaced (``workbench.run`` was ``run.py``): found in
the package's modules, with a `FutureWarning` naming where they live now, until 0.3."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import Any, Callable


def forwarder(package: str, modules: tuple[str, ...], public: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: the names of ``public`` (name -> module) without a warning, any
    other name that one of ``modules`` defines with a `FutureWarning` naming that module."""

    def __getattr__(name: str) -> Any:
        if name in public:
            return getattr(importlib.import_module(public[name]), name)
        if importlib.util.find_spec(f"{package}.{name}") is not None:  # a module of the package
            return importlib.import_module(f"{package}.{name}")
        for module_name in modules:
            module = importlib.import_module(module_name)
            if name in vars(module) and not name.startswith("__"):
                warnings.warn(f"{package}.{name} moved to {module_name}.{name} in workbench 0.2; the old path goes "
                              "in 0.3", FutureWarning, stacklevel=2)  # fmt: skip
                return vars(module)[name]
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
