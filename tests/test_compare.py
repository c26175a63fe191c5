"""`workbench compare`: grouped folds, claims, resume, executors, CLI (the statistics: tests/test_statistics.py)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.cli import run as cli
from workbench.comparison.design import CompareSpec, fold_splits
from workbench.comparison.execute import compare
from workbench.comparison.report import Claim, verdicts
from workbench.core.errors import UserError

#: A features comparison small enough for the default suite (the source model pretrains 20 steps).
TINY = {"epochs": 1, "train_size": 60, "val_size": 20, "batch_size": 20, "task_options": {"pretrain_epochs": 20}}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(4, 60), folds=st.integers(2, 6), seed=st.integers(0, 2**31), share=st.floats(0.05, 0.9))
def test_every_group_is_tested_exactly_once_and_never_trains_against_itself(n, folds, seed, share):
    groups = [f"g{i}" for i in range(n)]
    if n < folds + 2 or n - math.ceil(n / folds) < 2:
        with pytest.raises(UserError, match="lower --folds"):
            fold_splits(groups, folds, seed, share)
        return
    splits = fold_splits(groups, folds, seed, share)
    assert len(splits) == folds
    tested = [g for split in splits for g in split["test"]]
    assert sorted(tested) == sorted(groups)  # each group tested exactly once
    for split in splits:
        assert split["val"] and not set(split["val"]) & set(split["test"])
        assert len(groups) - len(split["val"]) - len(split["test"]) >= 1  # something trains
    assert fold_splits(groups, folds, seed, share) == splits  # the seed fixes the splits


def _comparison(differences, lower=()):
    """lora against full, one cell per difference, each on its own seed (independent units)."""
    cells = [{"method": "full", "fold": 0, "seed": 200 + k, "metrics": {"m": 0.5}} for k in range(len(differences))]
    cells += [{"method": "lora", "fold": 0, "seed": 200 + k, "metrics": {"m": 0.5 + d}}
              for k, d in enumerate(differences)]  # fmt: skip
    return {"spec": {"reference": "full"}, "lower_is_better": list(lower), "cells": cells}


def _holds(claim, comparison):
    return verdicts([claim], comparison)[0]


def test_a_claim_holds_only_when_its_interval_clears_the_margin():
    up = _comparison([0.04, 0.05, 0.06, 0.05, 0.045, 0.055])
    assert _holds(Claim("lora", "m"), up)["holds"]
    assert _holds(Claim("lora", "m"), up)["difference"] == pytest.approx(0.05)
    above = _holds(Claim("lora", "m", margin=0.1), up)
    assert not above["holds"] and above["verdict"] == "does not hold"  # the whole interval is below the margin
    assert not _holds(Claim("full", "m", against="lora"), up)["holds"]  # the other way round
    noise = _comparison([0.04, -0.05, 0.06, -0.05, 0.01, -0.02])
    assert _holds(Claim("lora", "m"), noise)["verdict"] == "no verdict"
    assert _holds(Claim("lora", "m", kind="not_worse", margin=0.2), noise)["holds"]
    down = _comparison([-0.05, -0.04, -0.06, -0.05, -0.03, -0.05])
    assert _holds(Claim("lora", "m"), _comparison([-0.05, -0.06, -0.04], lower=["m"]))["holds"]  # an error that fell
    assert _holds(Claim("lora", "m", direction="lower"), down)["holds"]
    assert _holds(Claim("lora", "m"), down)["verdict"] == "does not hold"


def test_compare_runs_every_cell_on_the_same_splits_and_continues_where_it_stopped(tmp_path):
    spec = CompareSpec("features", ("full", "warmpot"), folds=2, seeds=(0,), **TINY)
    first = compare(spec, tmp_path / "c", quiet=True)
    cells = first["cells"]
    assert len(cells) == 4 and {c["method"] for c in cells} == {"full", "warmpot"}
    for seed in (0,):
        splits = {m: [c["split"] for c in cells if c["seed"] == seed and c["method"] == m] for m in ("full", "warmpot")}
        assert splits["full"] == splits["warmpot"]  # every method on the same cells
        tested = [g for split in splits["full"] for g in split["test"]]
        assert len(tested) == len(set(tested)) == first["groups_per_seed"][str(seed)]
    assert first["budget_note"] == "every method took the same optimizer steps in every cell"
    paired = first["summary"]["warmpot"]["metrics"]["accuracy"]["vs_reference"]
    assert paired["cells"] == 2 and paired["units"] == 1 and paired["verdict"].startswith("no verdict: 1 unit")
    assert (tmp_path / "c" / "report.md").read_text().count("| warmpot |") == 1
    assert (tmp_path / "c" / "forest.png").stat().st_size > 0

    # an interrupted compare: one cell's run never finished (no metrics, no seal, no record)
    cell = tmp_path / "c" / "cells" / "warmpot" / "fold1-seed0"
    for name in ("cell.json", "seal.json", "metrics.json"):
        (cell / name).unlink()
    kept = (tmp_path / "c" / "cells" / "full" / "fold0-seed0" / "cell.json").stat().st_mtime_ns
    again = compare(spec, tmp_path / "c", quiet=True)
    assert (tmp_path / "c" / "cells" / "full" / "fold0-seed0" / "cell.json").stat().st_mtime_ns == kept
    assert [c["metrics"] for c in again["cells"]] == [c["metrics"] for c in cells]

    with pytest.raises(UserError, match="batch-size 64 is larger than --train-size 60"):
        compare(CompareSpec("features", ("full",), folds=2, seeds=(0,), **{**TINY, "batch_size": 64}),
                tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # refused before anything is written
    with pytest.raises(UserError, match="other settings"):
        compare(CompareSpec("features", ("full", "warmpot"), folds=3, seeds=(0,), **TINY), tmp_path / "c")


@pytest.mark.slow  # ~45 s: starts a local Dask cluster
def test_a_dask_cluster_gives_the_local_executors_numbers(tmp_path):
    pytest.importorskip("distributed")
    spec = CompareSpec("features", ("pada",), folds=2, seeds=(3,), **TINY)
    local = compare(spec, tmp_path / "local", workers=2, quiet=True)
    dask = compare(spec, tmp_path / "dask", workers=2, executor="dask", quiet=True)
    assert [c["metrics"] for c in dask["cells"]] == [c["metrics"] for c in local["cells"]]
    assert {c["threads"] for c in dask["cells"]} == {c["threads"] for c in local["cells"]}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--methods", "full,nosuch"], "nosuch"),
        (["--methods", "full,warmpot", "--folds", "1"], "--folds must be at least 2"),
        (["--methods", "full,warmpot", "--reference", "pada"], "--reference pada is not one of"),
        (["--methods", "full,warmpot", "--seeds", "1-x"], "--seeds takes comma-separated numbers"),
        (["--methods", "full,warmpot", "--set", "warmpot.nosuch=1"], "has no option nosuch"),
        (["--methods", "full,full"], "names a method twice"),
        (["--methods", "full", "--select-on", "nosuch"], "selects on loss or one of its metrics"),
        (["--methods", "full", "--warmup-share", "0.1"], "needs --schedule linear"),
    ],
)
def test_compare_refuses_bad_command_lines_in_one_line(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        from workbench.cli import main

        main(["compare", "--domain", "features", *flags, "--out", str(tmp_path / "x")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not (tmp_path / "x").exists()


def test_compare_from_the_command_line_with_a_task_option(tmp_path):
    out = tmp_path / "cli"
    code = cli(["compare", "--domain", "features", "--methods", "full,warmpot", "--folds", "2", "--seeds", "5",
                "--epochs", "1", "--train-size", "60", "--val-size", "20", "--batch-size", "20",
                "--lr-grid", "1e-4,1e-2", "--pretrain-epochs", "20", "--set", "warmpot.mass=0.3",
                "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    spec = json.loads((out / "spec.json").read_text())
    assert spec["task_options"] == {"pretrain_epochs": 20} and spec["seeds"] == [5]
    assert spec["method_options"] == {"warmpot": {"mass": 0.3}}
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["summary"]["warmpot"]["cells"] == 2
    for cell in comparison["cells"]:  # each cell kept the rate of the lowest validation loss
        losses = cell["lr_grid"]
        assert set(losses) == {"0.0001", "0.01"} and cell["learning_rate"] == float(min(losses, key=losses.get))
        assert cell["best_val_loss"] == min(losses.values())
    assert "chosen per cell" in (out / "report.md").read_text()


def test_every_method_trains_under_the_compared_schedule_and_selection(tmp_path):
    """--schedule linear --select-on METRIC reach every cell's run: the rate decays to 0 at the last step, and the
    kept epoch is the one of the best validation metric (its negation is the objective)."""
    out = tmp_path / "schedule"
    code = cli(["compare", "--domain", "features", "--methods", "full", "--folds", "2", "--seeds", "5",
                "--epochs", "3", "--train-size", "60", "--val-size", "20", "--batch-size", "20",
                "--pretrain-epochs", "20", "--schedule", "linear", "--warmup-share", "0.2",
                "--select-on", "balanced_accuracy", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["budget_note"].endswith("decayed linearly to 0; the epoch (and early stopping) chosen on "
                                              "validation balanced_accuracy")  # fmt: skip
    for cell in comparison["cells"]:
        result = json.loads((out / cell["run"] / "results" / "full.json").read_text())
        history = result["history"]
        assert history[-1]["lr"] == 0.0 and max(h["lr"] for h in history) > 0
        assert all(-1.0 <= h["objective"] <= 0.0 for h in history)  # a negated balanced accuracy
        assert result["best_epoch"] == min(history, key=lambda h: h["objective"])["epoch"]
        assert cell["best_objective"] == min(h["objective"] for h in history)
    assert "chosen on validation balanced_accuracy" in (out / "report.md").read_text()


@pytest.mark.slow
def test_sleep_staging_compare_end_to_end(tmp_path):
    """The issue's second command: LoRA, full fine-tuning and head-only tuning of LaBraM on subject folds."""
    out = tmp_path / "sleep"
    code = cli(["compare", "--domain", "sleepedf", "--methods", "lora,full,readout", "--folds", "2", "--seeds", "0",
                "--epochs", "1", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["group_kind"] == "subject" and len(comparison["cells"]) == 6
    for cell in comparison["cells"]:
        run = json.loads((out / cell["run"] / "metrics.json").read_text())
        assert sorted(run["data_summary"]["split"]["test"]) == sorted(cell["split"]["test"])  # the fold's subjects
    steps = {c["method"]: c["steps"] for c in comparison["cells"] if c["fold"] == 0}
    assert len(set(steps.values())) == 1 and steps["lora"] > 0  # one budget


def test_the_methods_settings_choose_the_compared_data_for_every_cell(tmp_path):
    """The density-ratio methods' setting (`FeaturesTask.profile`: the covariate-shift problem) becomes the
    comparison's task option, so the fold plan and every cell read the same data (before, the first dre-pp cell
    failed: its validation rows were planned on the partial-DA problem)."""
    out = tmp_path / "dre"
    code = cli(["compare", "--domain", "features", "--methods", "full,dre-pp", "--folds", "2", "--seeds", "5",
                "--epochs", "1", "--train-size", "60", "--val-size", "20", "--batch-size", "20",
                "--pretrain-epochs", "20", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    assert json.loads((out / "spec.json").read_text())["task_options"] == {"problem": "covariate-shift",
                                                                            "pretrain_epochs": 20}  # fmt: skip
    cells = json.loads((out / "comparison.json").read_text())["cells"]
    assert sorted(cell["method"] for cell in cells) == ["dre-pp", "dre-pp", "full", "full"]
    assert len({cell["manifest"]["data_fingerprint"] for cell in cells}) == 1
    with pytest.raises(UserError, match="give --problem covariate-shift"):  # a spec built in Python is told
        CompareSpec("features", ("full", "dre-pp"), seeds=(5,)).check()
    CompareSpec("features", ("full", "dre-pp"), seeds=(5,), task_options={"problem": "partial-da"}).check()


def test_methods_whose_settings_ask_for_different_data_are_refused(monkeypatch):
    from workbench.comparison.design import methods_task_options
    from workbench.core.registry import tasks

    task_cls = tasks.get("features")
    asked = {"dre-pp": "covariate-shift", "warmpot": "partial-da"}
    monkeypatch.setattr(task_cls, "profile", classmethod(lambda cls, method: {"options": {"problem": asked[method]}}
                                                         if method in asked else {}))  # fmt: skip
    with pytest.raises(UserError, match="dre-pp runs task 'features' with --problem covariate-shift, warmpot with "
                                        "--problem partial-da"):  # fmt: skip
        methods_task_options("features", ("full", "dre-pp", "warmpot"), {})
    assert methods_task_options("features", ("full", "dre-pp", "warmpot"), {"problem": "partial-da"}) == {}
