"""``python -m workbench.cli``: the command-line interface, as ``python -m workbench``."""

from workbench.cli import main

main()
