"""``python -m workbench`` (and ``torchrun -m workbench``) run the command-line interface."""

from workbench.cli import main

main()
