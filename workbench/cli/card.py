"""``workbench card RUN``: a model card (Markdown) written from a finished run."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.cli.flags import _add_seal_key
from workbench.cli.predict import _add_calibration


def _add_card_command(commands: Any) -> None:
    """``workbench card RUN [--output FILE] [--calibration LAYER]``."""
    card = commands.add_parser("card", help="write a model card (Markdown) from a finished run")
    card.add_argument("run_folder", metavar="RUN", help="run directory (from workbench adapt)")
    card.add_argument("--output", metavar="FILE", help="where to write it, outside the run folder (default: "
                      "card-<run name>.md here)")  # fmt: skip
    card.add_argument("--overwrite", action="store_true", help="replace an earlier card at --output")
    _add_calibration(card)
    _add_seal_key(card)


def run_card(args: argparse.Namespace) -> int:
    """``workbench card``: the card (`workbench.clinical.card.write_card`) and where it went."""
    from workbench.clinical.card import write_card

    print(f"wrote {write_card(args.run_folder, args.output, overwrite=args.overwrite, calibration=args.calibration)}")
    return 0
