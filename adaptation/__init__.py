"""Adaptation methods (``workbench.adaptation``), one method or method family per module; each registers itself in
`workbench.core.registry.methods` and is found through the ``workbench.methods`` entry points.

Imports go one way: the engine (``workbench``) ← ``workbench.models`` ← ``workbench.adaptation`` ←
``workbench.domains`` (ARCHITECTURE.md). Importing this package imports ``workbench.models`` first, which makes
third-party model libraries import safely whoever imports them next.
"""

import workbench.models  # noqa: F401
