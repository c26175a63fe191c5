"""Auditable cells of `workbench compare`: each record's manifest and kept epoch, and ``--rerun-cell``."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import EMBEDDED_RMD17, cli

from workbench.cli.parser import _chosen_plugins
from workbench.comparison.cells import kept_epoch, source_commit
from workbench.comparison.design import CompareSpec
from workbench.comparison.execute import compare
from workbench.comparison.rerun import rerun_cell
from workbench.core.errors import UserError
from workbench.core.registry import tasks
from workbench.core.trainer import Trainer, TrainSettings
from workbench.run.fingerprint import data_fingerprint

EPOCHS = 3
#: Two methods × 2 folds × 1 seed of the features task, small enough for the default suite (~10 s).
SPEC = CompareSpec("features", ("full", "warmpot"), folds=2, seeds=(0,), epochs=EPOCHS, train_size=60, val_size=20,
                   batch_size=20, task_options={"pretrain_epochs": 20})  # fmt: skip
MANIFEST = {"config_hash", "data_fingerprint", "versions", "commit", "steps", "kept_epoch", "wall_seconds"}
CELL = "warmpot/fold1-seed0"


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """(folder, comparison.json) of the tiny comparison; tests that edit a record edit a copy."""
    out = tmp_path_factory.mktemp("audit") / "cmp"
    return out, compare(SPEC, out, quiet=True)


def _copy(out, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    return copy


def test_every_cell_records_its_manifest_and_the_epoch_its_run_kept(comparison):
    out, result = comparison
    cells = result["cells"]
    assert len(cells) == 4
    for cell in cells:
        manifest = cell["manifest"]
        assert set(manifest) == MANIFEST
        assert re.fullmatch("[0-9a-f]{64}", manifest["config_hash"])
        assert re.fullmatch("[0-9a-f]{64}", manifest["data_fingerprint"])
        assert set(manifest["versions"]) == {"python", "torch", "numpy", "scipy", "workbench"}
        assert manifest["versions"]["torch"] == torch.__version__
        assert manifest["commit"] is None or re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", manifest["commit"])
        assert manifest["steps"] == cell["steps"] > 0
        assert manifest["wall_seconds"] >= cell["train_seconds"] > 0
        # the kept epoch is the one the run itself reports (run.py's best epoch, counted from 0)
        run = json.loads((out / cell["run"] / "results" / f"{cell['method']}.json").read_text())
        assert manifest["kept_epoch"] == cell["kept_epoch"] == run["best_epoch"] + 1
        assert 1 <= cell["kept_epoch"] <= EPOCHS == cell["epochs"]
    # one seed: one data set; another method or another fold (split): another configuration
    assert len({cell["manifest"]["data_fingerprint"] for cell in cells}) == 1
    assert len({cell["manifest"]["config_hash"] for cell in cells}) == len(cells)
    # warmpot's warm-up epochs cannot be kept even when their validation loss is lower
    warmpot = json.loads((out / "cells" / CELL / "results" / "warmpot.json").read_text())["history"]
    selectable = [row for row in warmpot if row["selectable"]]
    assert len(selectable) < EPOCHS
    assert next(c for c in cells if c["run"] == f"cells/{CELL}")["kept_epoch"] == min(
        selectable, key=lambda row: row["objective"])["epoch"] + 1  # fmt: skip


def _trainer(val_loss: float, select_from: int) -> Trainer:
    """A trainer of a linear model whose validation loss is ``val_loss`` in every epoch (ties, or NaN)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    samples = [(torch.randn(2), torch.randn(1)) for _ in range(10)]

    def loss(model, batch, training):
        x, y = batch
        mse = ((model(x) - y) ** 2).mean()
        return mse if training else mse * 0 + val_loss

    settings = TrainSettings(epochs=4, batch_size=5, ema_decay=None, patience=10, select_from=select_from)
    collate = lambda samples, device: tuple(torch.stack(part) for part in zip(*samples))  # noqa: E731
    return Trainer(model, loss, collate, samples, samples[:5], settings, progress=False)


@pytest.mark.parametrize("val_loss, select_from, kept", [(1.0, 0, 1), (1.0, 2, 3), (math.nan, 0, 4)])
def test_kept_epoch_is_the_epoch_the_trainer_keeps(val_loss, select_from, kept):
    """Ties keep the first selectable epoch, as the trainer does; with no better objective (NaN) the last epoch's
    weights stay."""
    trainer = _trainer(val_loss, select_from)
    history = trainer.fit()
    assert kept_epoch(history) == kept
    assert trainer.best["epoch"] + 1 == (kept if trainer.best["state"] is not None else 0)


def test_kept_epoch_counts_over_all_stages_and_only_the_last_stage_chooses():
    rows = [("align", 0.1, True), ("align", 0.2, True), ("tune", 0.9, False), ("tune", 0.5, True), ("tune", 0.5, True),
            ("tune", 0.7, True)]  # fmt: skip
    history = [{"epoch": e, "stage": s, "val_loss": v, "selectable": ok} for e, (s, v, ok) in enumerate(rows)]
    assert kept_epoch(history) == 4
    assert kept_epoch([]) is None


def test_a_rerun_cell_reproduces_its_record_and_leaves_the_comparison_as_it_was(comparison):
    out, _ = comparison
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
    result = rerun_cell(out, CELL)
    assert result["matches"] and result["mismatched"] == [] and result["changed"] == []
    assert set(result["differences"]) >= {"accuracy", "macro_f1"}
    assert all(difference == 0.0 for difference in result["differences"].values())  # bit for bit
    assert all(entry["match"] for entry in result["hashes"].values())
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before

    code = cli("compare", "--rerun-cell", "full/fold0-seed0", str(out))
    assert code.returncode == 0, code.stderr
    assert "ok: cell full/fold0-seed0 reproduces" in code.stdout and "config_hash: match" in code.stdout


def _edit_record(out, change, reseal: bool):
    """Change the record of `CELL` in ``out``; ``reseal``: seal its folder anew with the session's (trusted) key, as
    an honest record that merely differs would be (one written before manifests, say)."""
    from workbench.core.seal import seal

    record_path = out / "cells" / CELL / "cell.json"
    record = json.loads(record_path.read_text())
    change(record)
    record_path.write_text(json.dumps(record))
    if reseal:
        seal(record_path.parent, "cell")
    return record


@pytest.mark.parametrize("accuracy", [0.123, 123.0])
def test_an_edited_record_is_reported_as_modified_never_as_not_reproducing(comparison, tmp_path, accuracy):
    """Issue 53: an edited cell.json was blamed on the method ("metric(s) accuracy differ"); it is a modified record."""
    out = _copy(comparison[0], tmp_path)
    _edit_record(out, lambda record: record["metrics"].update(accuracy=accuracy), reseal=False)
    with pytest.raises(UserError, match="the recorded cell or its comparison was modified after it was written"):
        rerun_cell(out, CELL)
    code = cli("compare", "--rerun-cell", CELL, str(out))
    assert code.returncode == 2 and f"{out / 'cells' / CELL / 'cell.json'}: " in code.stderr
    assert "changed after the cell was recorded" in code.stderr
    assert "differ by more than" not in code.stdout + code.stderr
    (out / "cells" / CELL / "seal.json").unlink()  # nor without its seal
    with pytest.raises(UserError, match="seal.json: missing"):
        rerun_cell(out, CELL)


def test_a_resealed_record_that_differs_is_a_mismatch_and_an_old_record_still_reads(comparison, tmp_path):
    out = _copy(comparison[0], tmp_path)

    def old_and_different(record):
        record["metrics"]["accuracy"] = 0.123
        del record["manifest"], record["kept_epoch"]  # as written before manifests existed

    _edit_record(out, old_and_different, reseal=True)
    result = rerun_cell(out, CELL)
    assert not result["matches"] and result["mismatched"] == ["accuracy"]
    assert result["differences"]["accuracy"] == pytest.approx(abs(0.123 - result["rerun"]["accuracy"]))
    assert all(entry["match"] is None for entry in result["hashes"].values()) and result["changed"] == []
    summary = compare(SPEC, out, quiet=True)  # every cell recorded: only the summary is made again
    assert "manifest" not in next(c for c in summary["cells"] if c["run"] == f"cells/{CELL}")


def test_a_recorded_metric_out_of_range_is_refused_even_under_a_valid_seal(comparison, tmp_path):
    out = _copy(comparison[0], tmp_path)
    _edit_record(out, lambda record: record["metrics"].update(accuracy=123.0), reseal=True)
    path = out / "cells" / CELL / "cell.json"
    with pytest.raises(UserError, match=r"metrics\.accuracy is 123\.0, expected a number in \[0, 1\]"):
        rerun_cell(out, CELL)
    with pytest.raises(UserError, match=re.escape(f"{path}: metrics.accuracy is 123.0")):
        compare(SPEC, out, quiet=True)


def test_the_command_line_names_the_differing_metric_and_a_changed_data_fingerprint(comparison, tmp_path):
    out = _copy(comparison[0], tmp_path)

    def differs(record):
        record["metrics"]["accuracy"] = 0.123
        record["manifest"]["data_fingerprint"] = "0" * 64

    _edit_record(out, differs, reseal=True)
    code = cli("compare", "--rerun-cell", CELL, str(out))
    assert code.returncode == 1, code.stderr
    verdict = code.stdout.splitlines()[-1]
    assert verdict.startswith(f"not ok: cell {CELL}") and "metric(s) accuracy differ by more than 1e-09" in verdict
    assert "data fingerprint differs from the recorded one (the data changed: the likely reason)" in verdict
    assert "config hash" not in verdict and "macro_f1" not in verdict
    assert re.search(r"^accuracy\s+0\.123\s", code.stdout, re.MULTILINE)


@pytest.mark.parametrize(
    "where, message",
    [("cell", "has no recorded cell 'full/fold7-seed0'"), ("empty", "no spec.json"), (None, "needs --domain")],
)
def test_an_unknown_cell_or_folder_is_one_line_and_exit_2(comparison, tmp_path, where, message):
    out, _ = comparison
    args = {"cell": ["--rerun-cell", "full/fold7-seed0", str(out)], "empty": ["--rerun-cell", CELL, str(tmp_path)],
            None: ["--folds", "2"]}[where]  # fmt: skip
    code = cli("compare", *args)
    assert code.returncode == 2
    assert message in code.stderr and "Traceback" not in code.stderr
    with pytest.raises(UserError, match="no spec.json"):
        rerun_cell(tmp_path / "nowhere", CELL)


def test_the_rerun_takes_its_task_from_the_comparison_folder(comparison):
    out, _ = comparison
    assert _chosen_plugins(["compare", "--rerun-cell", CELL, str(out)]) == {"task": ["features"]}
    assert _chosen_plugins(["compare", "--rerun-cell", CELL, str(out / "nowhere")]) == {}


def test_the_data_fingerprint_hashes_names_and_bytes_wherever_the_folder_lies(tmp_path):
    first = tmp_path / "a"
    (first / "sub").mkdir(parents=True)
    (first / "x.npz").write_bytes(b"\x00\x01")
    (first / "sub" / "y.csv").write_text("1,2\n")
    fingerprint = data_fingerprint(first, "features", {}, 0)
    assert data_fingerprint(shutil.copytree(first, tmp_path / "b"), "features", {}, 0) == fingerprint
    (tmp_path / "b" / "sub" / "y.csv").write_text("1,3\n")
    assert data_fingerprint(tmp_path / "b", "features", {}, 0) != fingerprint
    (first / "sub" / "y.csv").rename(first / "sub" / "z.csv")
    assert data_fingerprint(first, "features", {}, 0) != fingerprint
    # the default data: generated (a text naming the generator, options and seed) or embedded (its files)
    generated = data_fingerprint(None, "features", {}, 0)
    assert generated != data_fingerprint(None, "features", {}, 1)
    assert generated != data_fingerprint(None, "features", {"dim": 7}, 0)
    assert generated == data_fingerprint(None, "features", {"pretrain_epochs": 5}, 0)  # not an option of the data
    assert data_fingerprint(None, "rmd17", {}, 0) == data_fingerprint(EMBEDDED_RMD17, "rmd17", {}, 0)


def test_every_task_names_its_default_data():
    """An existing file or folder of embedded data, or a text naming the generator with its seed."""
    for name, cls in tasks.items():
        try:
            source = cls().default_data(3)
        except UserError:  # its extra is not installed
            continue
        if isinstance(source, Path):
            assert source.is_file() or any(path.is_file() for path in source.rglob("*")), name
        else:
            assert "seed=3" in source, name


def test_the_commit_is_none_without_git(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    source_commit.cache_clear()  # read once per process: the source it imported
    try:
        assert source_commit() is None
    finally:
        source_commit.cache_clear()
