"""Domains (``workbench.domains``): each sub-package reads one kind of scientific data and defines its tasks, which
register themselves in `workbench.core.registry.tasks` and are found through the ``workbench.tasks`` entry points.
Modules shared by several domains (signals, splits, plots) sit at this level; a domain never imports another
domain's package.

Importing this package imports ``workbench.models`` first, which makes third-party model libraries import safely
whoever imports them next.
"""

import workbench.models  # noqa: F401
