"""Whether ``--out`` can take a run, and what ``--resume`` checks: the interrupted run's settings (its
``config.yaml``, confirmed by ``fingerprint.json``) and data are those of the run asked for."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from workbench.core.config import RunConfig, upgraded
from workbench.core.errors import UserError
from workbench.core.settings import SETTINGS
from workbench.run.fingerprint import data_changes, settings_hash
from workbench.run.rundir import check_out_path

log = logging.getLogger("workbench")
#: Each setting's default as ``config.yaml`` would hold it (a tuple as a list).
DEFAULTS = {s.stored_name: list(s.default) if isinstance(s.default, tuple) else s.default for s in SETTINGS}
def check_out_dir(out_dir: Path, config: RunConfig, resume: bool, fitted: tuple[str, ...] = ()) -> None:
    """``--out`` can take this run (`workbench.run.rundir.check_out_path`); with ``resume``, the interrupted run there
    had the settings of ``config`` (``fitted``: settings the run chooses itself, kept from the interrupted run), as
    its ``config.yaml`` says and its ``fingerprint.json`` confirms. A `UserError` in one line naming what differs."""
    check_out_path(out_dir, resume)
    saved = out_dir / "config.yaml"
    if resume:
        if not saved.is_file():
            raise UserError(f"{out_dir}: nothing to resume (no config.yaml); give the --out of an earlier run")
        try:
            earlier = yaml.safe_load(saved.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            earlier = error
        if not isinstance(earlier, dict):
            found = f"not YAML: {str(earlier).splitlines()[0]}" if isinstance(earlier, Exception) else "no mapping"
            raise UserError(f"{saved}: damaged ({found}), not the configuration a run writes; this run cannot be "
                            f"resumed: start afresh in another --out")  # fmt: skip
        now, named_now = config.to_dict(), upgraded(earlier)  # a run written before a rename: its keys as named now
        named_now = {**DEFAULTS, **named_now}  # a run written before a setting existed ran at its default
        ignored = {"out", *fitted}
        changed = {
            key: (named_now.get(key), now[key]) for key in now if key not in ignored and named_now.get(key) != now[key]
        }
        if changed:
            details = "; ".join(f"{key}: was {old!r}, now {new!r}" for key, (old, new) in changed.items())
            raise UserError(f"{saved}: --resume must use the same settings as the interrupted run ({details})")
        recorded = read_fingerprint(out_dir)
        if recorded is not None and recorded.get("settings_hash") != run_settings_hash(earlier):
            raise UserError(f"{saved}: changed since the run started (its settings no longer match "
                            f"{out_dir / FINGERPRINT}); this run cannot be resumed: start afresh in another "
                            "--out")  # fmt: skip


#: The file in which a run records, when it starts, what its numbers depend on (`workbench.run.fingerprint`).
FINGERPRINT = "fingerprint.json"


def run_settings_hash(settings: dict[str, Any]) -> str:
    """`workbench.run.fingerprint.settings_hash` of a run's resolved configuration, less where it writes."""
    return settings_hash({key: value for key, value in settings.items() if key != "out"})


def read_fingerprint(out_dir: Path) -> dict[str, Any] | None:
    """The ``fingerprint.json`` of the run in ``out_dir``; None for a run started before runs recorded one."""
    path = out_dir / FINGERPRINT
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        content = error
    if not isinstance(content, dict):
        raise UserError(f"{path}: damaged ({'not JSON' if isinstance(content, Exception) else 'no JSON object'}); "
                        "what this run started with cannot be checked: start afresh in another --out")  # fmt: skip
    return content


def check_data(out_dir: Path, now: dict[str, Any]) -> None:
    """The interrupted run in ``out_dir`` started on the data whose `workbench.run.fingerprint.data_record` is ``now``:
    a `UserError` naming what changed when not; a warning when the run is older than fingerprints."""
    recorded = read_fingerprint(out_dir)
    if recorded is None:
        log.warning("%s was started before runs recorded their data's fingerprint: resuming without checking that "
                    "its data are unchanged", out_dir)  # fmt: skip
        return
    if recorded.get("data_fingerprint") != now["data_fingerprint"]:
        raise UserError(f"{out_dir}: the data changed since this run started ({data_changes(recorded, now)}); "
                        "resuming would mix two data sets: give the data it started on, or start afresh in another "
                        "--out")  # fmt: skip
