"""Every registered model family refuses bad checkpoint files with a `UserError` naming the file — never a
traceback, never an unpickle.

For each family (parametrized over the registry: a family without a case here fails `test_every_family_has_a_case`),
each of its checkpoint kinds is loaded good (it must load), then made bad in ``tmp_path``:

- truncated to half, and empty;
- a pickle whose unpickling would create a marker file, under every checkpoint suffix (the marker must never appear);
- every other family's valid checkpoint (of another format);
- for a checkpoint with a ``.json`` architecture beside it: that file truncated, not a JSON object, another family's,
  or its own with one of the sizes changed.

Two command-line checks run the physio task on a damaged and a pickled ``--model``: exit 2, one line, no run folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from workbench.core.errors import UserError
from workbench.core.registry import models, tasks

CHECKPOINTS = Path(__file__).resolve().parents[1] / "models" / "checkpoints"
#: Suffixes a pickle is renamed to: every family must refuse it without ``trust_checkpoint``.
PICKLE_SUFFIXES = (".safetensors", ".model", ".pt", ".pth", ".bin")


class Trap:
    """Unpickling this creates ``marker``: a loader that unpickles is caught by the file's appearance."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@dataclass
class Good:
    """A valid checkpoint of a family: its weights file (a ``.json`` architecture beside it or not), the sizes it
    loads with, and its format (checkpoints of one format are not "another model's" to each other)."""

    weights: Path
    sizes: dict[str, Any] = field(default_factory=dict)
    format: str = ""

    @property
    def sidecar(self) -> Path | None:
        path = self.weights.with_suffix(".json")
        return path if path.is_file() else None

    @property
    def files(self) -> list[Path]:
        return [self.weights] + ([self.sidecar] if self.sidecar else [])


def _eeg_sizes(n_times: int, sfreq: float) -> dict[str, Any]:
    return {
        "n_chans": 2,
        "n_outputs": 3,
        "n_times": n_times,
        "sfreq": sfreq,
        "chs_info": ({"ch_name": "C3"}, {"ch_name": "C4"}),
    }


def _shipped_labram(folder: Path) -> Good:
    """The shipped sleepedf LaBraM backbone (a converted state dict, no .json), with the sizes it was made for."""
    from safetensors import safe_open

    path = CHECKPOINTS / "labram_sleepedf_small.safetensors"
    with safe_open(str(path), "pt") as handle:
        architecture = json.loads(handle.metadata()["architecture"])
    sizes = {k: architecture[k] for k in ("n_chans", "n_times", "sfreq", "channel_map")}
    sizes.update(n_outputs=5, chs_info=tuple({"ch_name": name} for name in architecture["ch_names"]))
    return Good(path, sizes, "labram-converted")


def _saved_eeg(family: str, sizes: dict[str, Any]) -> Callable[[Path], Good]:
    def make(folder: Path) -> Good:
        from workbench.models.eeg import save_eeg_model

        path = folder / f"{family}.safetensors"
        save_eeg_model(models.get(family)().load(None, **sizes), path)
        return Good(path, sizes, f"{family}-saved")

    return make


def _saved_graph(family: str) -> Callable[[Path], Good]:
    def make(folder: Path) -> Good:
        from workbench.models.graph import save_graph_net

        sizes = {"in_features": 6, "n_classes": 3}
        path = folder / f"{family}.safetensors"
        save_graph_net(models.get(family)().load(None, **sizes), path)
        return Good(path, sizes, "graph-net")  # one format for the three encoders: the .json names the encoder

    return make


def _saved_mlp(folder: Path) -> Good:
    from workbench.models.mlp import save_feature_net

    sizes = {"in_features": 5, "n_outputs": 3}
    path = folder / "mlp.safetensors"
    save_feature_net(models.get("mlp")().load(None, **sizes), path)
    return Good(path, sizes, "mlp")


def _saved_patch_gpt(folder: Path) -> Good:
    from workbench.models.physio import save_patch_gpt

    sizes = tasks.get("physio")().model_sizes()  # the physio task's sizes need no data
    path = folder / "patch-gpt.safetensors"
    save_patch_gpt(models.get("patch-gpt")().load(None, pretrained=False, **sizes), path)
    return Good(path, sizes, "patch-gpt-saved")


#: family -> its checkpoint kinds (each: folder -> a `Good`). A new family needs an entry here.
CASES: dict[str, list[Callable[[Path], Good]]] = {
    "ecg": [
        lambda folder: Good(CHECKPOINTS / "ecg_teacher_small.safetensors", tasks.get("ptbxl")().model_sizes(), "ecg")
    ],
    "mace": [lambda folder: Good(CHECKPOINTS / "mace_xtb_small.safetensors", {}, "mace")],
    "medvl": [lambda folder: Good(CHECKPOINTS / "medvl-tiny.safetensors", {}, "medvl")],
    "patch-gpt": [
        lambda folder: Good(
            CHECKPOINTS / "patch_gpt_physio.safetensors", tasks.get("physio")().model_sizes(), "patch-gpt-backbone"
        ),
        _saved_patch_gpt,
    ],
    "labram": [_shipped_labram, _saved_eeg("labram", _eeg_sizes(200, 100.0))],
    "eegnet": [_saved_eeg("eegnet", _eeg_sizes(256, 128.0))],
    "shallow": [_saved_eeg("shallow", _eeg_sizes(256, 128.0))],
    "gnn": [_saved_graph("gnn")],
    "gcn": [_saved_graph("gcn")],
    "graph-mlp": [_saved_graph("graph-mlp")],
    "mlp": [_saved_mlp],
}


def _load(family: str, good: Good, path: Path) -> Any:
    return models.get(family)().load(path, **good.sizes)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, list[Good]]:
    """Every family's valid checkpoints (made once for the module), each checked to load."""
    folder = tmp_path_factory.mktemp("good")
    made = {}
    for family in models.names():  # the families installed here
        made[family] = [make(folder) for make in CASES.get(family, [])]
        for checkpoint in made[family]:
            _load(family, checkpoint, checkpoint.weights)  # a case that does not load is a broken case
    return made


def test_every_family_has_a_case():
    assert not set(models.names()) - set(CASES), "add a case to CASES for each new model family"


def _refused(family: str, good: Good, path: Path, names: list[Path], marker: Path | None = None) -> str | None:
    """None when loading ``path`` is a `UserError` naming one of ``names`` (and ``marker`` never appears); else what
    happened instead."""
    try:
        _load(family, good, path)
    except UserError as error:
        if not any(str(name) in str(error) for name in names):
            return f"{path.name}: UserError names none of {[n.name for n in names]}: {error}"
    except Exception as error:  # what the test is for: anything else is a traceback for the user
        return f"{path.name}: {type(error).__name__}: {str(error)[:200]}"
    else:
        return f"{path.name}: loaded"
    if marker is not None and marker.exists():
        return f"{path.name}: UNPICKLED (the trap's marker file appeared)"
    return None


def _copy(good: Good, folder: Path, stem: str) -> Path:
    """``good``'s weights (and .json) copied into ``folder`` as ``stem``; returns the weights path."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / f"{stem}{good.weights.suffix}"
    shutil.copyfile(good.weights, weights)
    if good.sidecar:
        shutil.copyfile(good.sidecar, weights.with_suffix(".json"))
    return weights


def _checkpoints(good: dict[str, list[Good]], family: str) -> list[tuple[int, Good]]:
    """(index, checkpoint) of ``family``'s cases; a family without a case fails its tests."""
    if not good[family]:
        pytest.fail(f"no case for model family '{family}' in CASES")
    return list(enumerate(good[family]))


@pytest.mark.parametrize("family", models.names())
def test_truncated_weights_are_refused(family, good, tmp_path):
    failures = []
    for index, checkpoint in _checkpoints(good, family):
        size = checkpoint.weights.stat().st_size
        for label, keep in (("half", size // 2), ("empty", 0)):
            weights = _copy(checkpoint, tmp_path / f"{index}-{label}", "model")
            with open(weights, "r+b") as handle:
                handle.truncate(keep)
            failures.append(_refused(family, checkpoint, weights, [weights]))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)


@pytest.mark.parametrize("family", models.names())
def test_pickles_are_refused_never_unpickled(family, good, tmp_path):
    failures = []
    for index, checkpoint in _checkpoints(good, family):
        for suffix in PICKLE_SUFFIXES:
            for with_sidecar in (True, False) if checkpoint.sidecar else (False,):
                folder = tmp_path / f"{index}{suffix}-{with_sidecar}"
                folder.mkdir()
                marker = folder / "UNPICKLED"
                weights = folder / f"model{suffix}"
                torch.save({"state_dict": {"w": torch.zeros(2)}, "trap": Trap(marker)}, weights)
                if with_sidecar:
                    shutil.copyfile(checkpoint.sidecar, weights.with_suffix(".json"))
                failures.append(_refused(family, checkpoint, weights, [weights], marker))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)


@pytest.mark.parametrize("family", models.names())
def test_other_models_checkpoints_are_refused(family, good, tmp_path):
    failures = []
    for _, checkpoint in _checkpoints(good, family):
        for other_family, others in good.items():
            for other in others:
                if other_family != family and other.format != checkpoint.format:
                    failures.append(_refused(family, checkpoint, other.weights, other.files))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)


@pytest.mark.parametrize("family", models.names())
def test_bad_architecture_files_are_refused(family, good, tmp_path):
    with_sidecar = [(index, checkpoint) for index, checkpoint in _checkpoints(good, family) if checkpoint.sidecar]
    if not with_sidecar:
        pytest.skip(f"{family}: no checkpoint with a .json architecture")
    foreign = [o.sidecar for others in good.values() for o in others if o.sidecar]
    failures = []
    for index, checkpoint in with_sidecar:
        text = checkpoint.sidecar.read_text()
        variants = {"truncated": text[: len(text) // 2], "list": "[1, 2]", "null": "null", "string": '"x"'}
        variants.update({f"other-{i}": o.read_text() for i, o in enumerate(foreign) if o.read_text() != text})
        architecture = json.loads(text)
        resizable = [k for k, v in architecture.items() if k in checkpoint.sizes and type(v) is int]
        if resizable:  # the architecture of another model of the family: one size the data fixes, plus one
            variants["resized"] = json.dumps({**architecture, resizable[0]: architecture[resizable[0]] + 1})
        for label, content in variants.items():
            weights = _copy(checkpoint, tmp_path / f"{index}-{label}", "model")
            weights.with_suffix(".json").write_text(content)
            failures.append(_refused(family, checkpoint, weights, [weights, weights.with_suffix(".json")]))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)


def test_the_trap_fires_when_trusted(tmp_path):
    """The marker trap is live: MACE's trusted ``.model`` path unpickles (by design) and then refuses a non-model."""
    marker, weights = tmp_path / "UNPICKLED", tmp_path / "model.model"
    torch.save({"trap": Trap(marker)}, weights)
    with pytest.raises(UserError, match="not a MACE model"):
        models.get("mace")().load(weights, trust_checkpoint=True)
    assert marker.exists()
    weights.write_bytes(weights.read_bytes()[:20])
    with pytest.raises(UserError, match=re.escape(str(weights))):
        models.get("mace")().load(weights, trust_checkpoint=True)


@pytest.mark.parametrize("damage", ["truncated", pytest.param("pickle", marks=pytest.mark.slow)])
def test_cli_refuses_a_bad_model_file(damage, tmp_path):
    weights = tmp_path / "model.safetensors"
    marker = tmp_path / "UNPICKLED"
    if damage == "truncated":
        weights.write_bytes((CHECKPOINTS / "patch_gpt_physio.safetensors").read_bytes()[:1000])
    else:
        torch.save({"trap": Trap(marker)}, weights)
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "workbench", "adapt", "--domain", "physio", "--model", str(weights), "--epochs", "1",
         "--quiet", "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and str(weights) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists() and not marker.exists()
