"""The features task: readers and their errors, the shift methods end to end, weights where they belong."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from test_cli import workbench
from workbench.domains.features.readers import read_feature_pair
from workbench.domains.features.task import FeatureShift

import workbench as wb
from workbench.core.errors import UserError


def write_pair(folder, source_ext="npz", target_ext="csv", n=40, d=3, **replace):
    """A small classification pair: source.<source_ext>, target.<target_ext>; ``replace`` swaps arrays."""
    rng = np.random.default_rng(0)
    arrays = {
        "source_features": rng.normal(size=(n, d)),
        "source_labels": rng.integers(0, 3, n),
        "target_features": rng.normal(size=(n, d)) + 0.5,
        "target_labels": rng.integers(0, 2, n),
    }
    arrays.update(replace)
    folder.mkdir(parents=True, exist_ok=True)
    for name, ext in (("source", source_ext), ("target", target_ext)):
        features, labels = arrays[f"{name}_features"], arrays[f"{name}_labels"]
        if ext == "npz":
            content = {"features": features} if labels is None else {"features": features, "labels": labels}
            np.savez(folder / f"{name}.npz", **content)
        else:
            frame = pd.DataFrame(features, columns=[f"f{i}" for i in range(features.shape[1])])
            if labels is not None:
                frame["label"] = labels
            frame.to_csv(folder / f"{name}.csv", index=False) if ext == "csv" else frame.to_parquet(
                folder / f"{name}.parquet"
            )
    return folder


@pytest.mark.parametrize("source_ext, target_ext", [("npz", "csv"), ("csv", "parquet"), ("parquet", "npz")])
def test_reader_round_trip(tmp_path, source_ext, target_ext):
    rng = np.random.default_rng(1)
    source_x, target_x = rng.normal(size=(30, 4)), rng.normal(size=(20, 4))
    target_y = rng.integers(0, 3, 20).astype(float)
    target_y[:5] = np.nan  # unlabelled target rows
    folder = write_pair(
        tmp_path / "pair",
        source_ext,
        target_ext,
        source_features=source_x,
        source_labels=np.arange(30) % 3,
        target_features=target_x,
        target_labels=target_y if target_ext != "npz" else np.where(np.isnan(target_y), -1, target_y).astype(int),
    )
    problem = read_feature_pair(folder)
    assert problem.kind == "classification" and problem.n_outputs == 3
    np.testing.assert_allclose(problem.source.features, source_x, rtol=1e-6)
    np.testing.assert_allclose(problem.target.features, target_x, rtol=1e-6)
    assert problem.source.labels.dtype == np.int64
    assert (problem.target.labels[:5] == -1).all() and (problem.target.labels[5:] == target_y[5:]).all()


@pytest.mark.parametrize(
    "replace, message",
    [
        ({"source_labels": None}, "source.npz: field 'labels'"),
        ({"source_features": np.full((40, 3), np.nan)}, "source.npz: field 'features': expected finite"),
        ({"target_features": np.zeros((40, 5))}, "target.csv: field 'features': expected 3 features"),
        ({"target_features": np.zeros((0, 3)), "target_labels": np.zeros(0)}, "target.csv"),
        ({"source_labels": np.full(40, 0.5)}, None),  # float labels: a regression problem, not an error
    ],
)
def test_reader_errors_name_file_and_field(tmp_path, replace, message):
    folder = write_pair(tmp_path / "pair", **replace)
    if message is None:
        assert read_feature_pair(folder).kind == "regression"
        return
    with pytest.raises(UserError, match=message):
        read_feature_pair(folder)


def test_two_source_files_is_an_error(tmp_path):
    folder = write_pair(tmp_path / "pair")
    np.savez(folder / "source.npz", features=np.zeros((2, 3)), labels=np.zeros(2, dtype=int))
    pd.DataFrame({"a": [1.0]}).to_csv(folder / "source.csv", index=False)
    with pytest.raises(UserError, match="exactly one of source.npz"):
        read_feature_pair(folder)


def test_unlabelled_target_cannot_be_scored(tmp_path):
    folder = write_pair(tmp_path / "pair", target_labels=None)
    with pytest.raises(UserError, match="the target has no labels"):
        FeatureShift().read(folder)


def test_target_labels_never_reach_training():
    task = FeatureShift()
    problem = task.read(None, seed=0)
    model = task.load_model(None)
    data, _ = task.prepare(model, problem, 200, 50, seed=0)
    assert all(sample.y == -1 for sample in data.target)
    ids = [s.id for split in (data.train, data.val, data.target, data.test) for s in split]
    assert len(ids) == len(set(ids))


@pytest.mark.slow
def test_partial_da_run_puts_weight_on_shared_classes(tmp_path):
    out = tmp_path / "run"
    workbench("adapt", "--domain", "features", "--out", str(out), "--epochs", "4", "--quiet")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "warmpot" and set(metrics["baselines"]) == {"pada", "full", "oracle"}
    assert set(metrics["before"]) == {"accuracy", "balanced_accuracy", "macro_f1"}
    assert metrics["baselines"]["oracle"]["outlier_weight_share"] == 0.0
    # uniform weights put the outlier classes' sample share on them; WARMPOT's plan far less
    assert metrics["after"]["outlier_weight_share"] < 0.3
    assert metrics["baselines"]["pada"]["outlier_weight_share"] < 0.5
    for name in ("report.md", "confusion.png", "learning_curves.png", "adapter.safetensors"):
        assert (out / name).is_file(), name
    rescored = wb.evaluate(out)
    assert rescored["accuracy"] == pytest.approx(metrics["after"]["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_density_ratio_run(tmp_path):
    out = tmp_path / "run"
    run = wb.adapt(domain="features", method="dre-pp", out=str(out), epochs=3, quiet=True)
    assert run.config.task_options["problem"] == "covariate-shift"
    assert set(run.metrics["baselines"]) == {"full", "dre-ulsif", "dre-kliep", "dre-logistic"}
    assert set(run.metrics["after"]) >= {"mse", "mae", "r2", "weight_effective_sample_share"}
    assert (out / "fits.png").is_file()
    x = torch.zeros(3, 20)
    assert run.model(x).shape == (3, 1)


def test_warmpot_runs_are_deterministic(tmp_path):
    first = wb.adapt(domain="features", baselines=[], out=str(tmp_path / "a"), epochs=2, quiet=True, train_size=200,
                     threads=1)  # a pinned thread count: runs that follow the load are not bit-comparable
    second = wb.adapt(domain="features", baselines=[], out=str(tmp_path / "b"), epochs=2, quiet=True, train_size=200,
                      threads=1)
    assert first.metrics["after"] == second.metrics["after"]


def test_bad_method_options_are_user_errors(tmp_path):
    result = workbench("adapt", "--domain", "features", "--mass", "1.5", "--out", str(tmp_path / "x"), check=False)
    assert result.returncode == 2 and "--mass" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()
