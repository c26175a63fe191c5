"""Intervals over a run's test items (`workbench.run.item_bootstrap`), the vectorised metrics behind them
(`workbench.core.resampled_metrics`, checked against `workbench.core.metrics`) and every task's `Task.rescore`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from workbench.core import metrics, resampled_metrics
from workbench.core.registry import tasks
from workbench.core.task import Task
from workbench.run import item_bootstrap, report


def _mean_intervals(values, groups, seed=0):
    rescore = lambda predictions, counts: {"mean": resampled_metrics.mean(predictions["x"], counts)}  # noqa: E731
    return item_bootstrap.item_intervals(rescore, {"m": {"x": values}}, groups, {"m": {"mean": values.mean()}}, {},
                                         seed)["intervals"]["m"]["mean"]  # fmt: skip


# ------------------------------------------------------------------------------------------------ the bootstrap
def test_percentile_interval_of_iid_items_agrees_with_scipy_and_the_t_interval():
    values = np.random.default_rng(1).normal(3.0, 2.0, 200)
    low, high = _mean_intervals(values, np.arange(200))
    reference = stats.bootstrap((values,), np.mean, n_resamples=20_000, method="percentile", confidence_level=0.95,
                                random_state=np.random.default_rng(2)).confidence_interval  # fmt: skip
    t_low, t_high = stats.t.interval(0.95, 199, loc=values.mean(), scale=stats.sem(values))
    se = stats.sem(values)
    assert abs(low - reference.low) < 0.15 * se and abs(high - reference.high) < 0.15 * se  # Monte Carlo error
    assert abs(low - t_low) < 0.2 * se and abs(high - t_high) < 0.2 * se


def test_a_rerun_with_the_same_seed_gives_the_same_interval_and_another_seed_another():
    values = np.random.default_rng(3).normal(size=40)
    assert _mean_intervals(values, np.arange(40), seed=7) == _mean_intervals(values, np.arange(40), seed=7)
    assert _mean_intervals(values, np.arange(40), seed=7) != _mean_intervals(values, np.arange(40), seed=8)


def test_the_cluster_bootstrap_draws_whole_groups():
    """Items identical within their group: the same interval as bootstrapping the group means (equal sizes)."""
    group_means = np.random.default_rng(4).normal(size=12)
    groups = np.repeat([f"patient{k:02d}" for k in range(12)], 5)  # sorted as the group means
    items = np.repeat(group_means, 5)
    assert _mean_intervals(items, groups, seed=5) == pytest.approx(_mean_intervals(group_means, np.arange(12), seed=5))
    counts = item_bootstrap.resample_counts(groups, np.random.default_rng(0), 50)
    assert (counts.reshape(50, 12, 5) == counts.reshape(50, 12, 5)[:, :, :1]).all()  # a group's items drawn together
    assert (counts.sum(axis=1) == 60).all()


def test_with_too_few_groups_items_are_drawn_within_each_group():
    """One test subject: drawing subjects would give one possible resample (an interval of width 0)."""
    groups = np.array(["s1"] * 6 + ["s2"] * 4)
    assert item_bootstrap.resampled_units(groups) == "items within groups"
    assert item_bootstrap.resampled_units(np.repeat(np.arange(5), 2)) == "groups"
    assert item_bootstrap.resampled_units(np.arange(3)) == "groups"  # items are their own groups
    counts = item_bootstrap.resample_counts(groups, np.random.default_rng(0), 200)
    assert (counts[:, :6].sum(axis=1) == 6).all() and (counts[:, 6:].sum(axis=1) == 4).all()
    assert len({tuple(row) for row in counts}) > 100
    values = np.random.default_rng(1).normal(size=20)
    low, high = _mean_intervals(values, np.zeros(20))
    assert low < values.mean() < high


def _coverage(draw, groups, repeats=400):
    rng = np.random.default_rng(6)
    covered = 0
    for _ in range(repeats):
        low, high = _mean_intervals(draw(rng), groups, seed=int(rng.integers(1 << 30)))
        covered += low <= 0.0 <= high
    return covered / repeats


def test_coverage_is_about_95_percent_and_clustered_items_need_the_cluster_bootstrap():
    assert 0.915 <= _coverage(lambda rng: rng.normal(size=60), np.arange(60)) <= 0.975
    groups = np.repeat(np.arange(30), 6)  # 30 subjects of 6 windows, most variation between subjects

    def clustered(rng):
        return np.repeat(rng.normal(size=30), 6) + 0.3 * rng.normal(size=180)

    assert 0.9 <= _coverage(clustered, groups) <= 0.975
    assert _coverage(clustered, np.arange(180), repeats=200) < 0.7  # items as if independent: far too narrow


def test_paired_differences_of_a_model_with_itself_are_exactly_zero_and_undefined_resamples_are_skipped():
    rng = np.random.default_rng(8)
    truth, scores = rng.integers(0, 2, (30, 2)), rng.random((30, 2))
    truth[:, 1] = 0
    truth[0, 1] = 1  # class 1 has one positive: most resamples leave its AUROC undefined

    def rescore(predictions, counts):
        auroc = resampled_metrics.per_class_ranking(predictions["truth"], predictions["scores"], counts)[0]
        return {"auroc_0": auroc[:, 0], "auroc_1": auroc[:, 1]}

    both = {"truth": truth, "scores": scores}
    estimates = {"a": {"auroc_0": 0.5, "auroc_1": 0.5}, "b": {"auroc_0": 0.5, "auroc_1": 0.5}}
    found = item_bootstrap.item_intervals(rescore, {"a": both, "b": both}, np.arange(30), estimates,
                                          {"a − b": ("a", "b")}, seed=0)  # fmt: skip
    assert found["differences"]["a − b"]["auroc_0"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert found["intervals"]["a"]["auroc_1"] is None  # defined in ~63 % of resamples, fewer than MIN_DEFINED
    assert found["differences"]["a − b"]["auroc_1"]["low"] is None
    values = np.r_[np.full(95, np.nan), np.arange(905.0)]
    assert item_bootstrap.percentile_interval(values) == pytest.approx(np.percentile(np.arange(905.0), [2.5, 97.5]))


# ------------------------------------------------------------------- resampled metrics against workbench.core.metrics
def _resamples(n, rng, count=20):
    return [rng.integers(0, n, n) for _ in range(count)]


@pytest.mark.parametrize("n_classes", [2, 5])
def test_label_metrics_of_resamples_equal_workbench_metrics_on_the_repeated_items(n_classes):
    rng = np.random.default_rng(n_classes)
    truth, predicted = rng.integers(0, n_classes, 40), rng.integers(0, n_classes, 40)
    predicted[:3] = truth[:3] = 0
    draws = _resamples(40, rng) + [np.zeros(40, int)]  # the last: one item, one class (kappa undefined)
    counts = np.stack([np.bincount(draw, minlength=40) for draw in draws])
    found = resampled_metrics.label_scores(resampled_metrics.confusion(truth, predicted, counts, n_classes))
    for r, draw in enumerate(draws):
        t, p = truth[draw], predicted[draw]
        assert found["accuracy"][r] == pytest.approx(metrics.accuracy(t, p), abs=1e-12)
        assert found["balanced_accuracy"][r] == pytest.approx(metrics.balanced_accuracy(t, p), abs=1e-12)
        assert found["macro_f1"][r] == pytest.approx(metrics.macro_f1(t, p), abs=1e-12)
        np.testing.assert_allclose(found["cohen_kappa"][r], metrics.cohen_kappa(t, p), atol=1e-12)
        labels = range(n_classes)
        np.testing.assert_allclose(found["recall"][r], metrics.per_class_recall(t, p, labels), atol=1e-12)
        np.testing.assert_allclose(found["f1"][r], metrics.per_class_f1(t, p, labels), atol=1e-12)


def test_ranking_and_multilabel_scores_of_resamples_equal_workbench_metrics():
    rng = np.random.default_rng(11)
    truth = (rng.random((25, 4)) < 0.35).astype(float)
    scores = np.round(rng.random((25, 4)), 1)  # ties
    thresholds = np.array([0.3, 0.5, 0.6, 0.4])
    draws = _resamples(25, rng)
    counts = np.stack([np.bincount(draw, minlength=25) for draw in draws])
    auroc, precision = resampled_metrics.per_class_ranking(truth, scores, counts)
    f1 = resampled_metrics.binary_f1(truth, scores >= thresholds, counts)
    for r, draw in enumerate(draws):
        np.testing.assert_allclose(auroc[r], metrics.per_class_auroc(truth[draw], scores[draw]), atol=1e-12)
        np.testing.assert_allclose(precision[r], metrics.per_class_average_precision(truth[draw], scores[draw]),
                                   atol=1e-12)  # fmt: skip
        expected = metrics.multilabel_scores(truth[draw], scores[draw], thresholds, list("abcd"))
        assert resampled_metrics.macro(auroc[r : r + 1])[0] == pytest.approx(expected["macro_auroc"], abs=1e-12)
        assert f1[r].mean() == pytest.approx(expected["macro_f1"], abs=1e-12)


# ------------------------------------------------------------------------------------------- every task's rescore
TASK_NAMES = sorted(tasks.names())
#: Metrics of `evaluate` that are not scores of the test items (no interval).
NOT_ITEM_METRICS = {"csbm": {"source_accuracy", "predicted_target_homophily", "predicted_class_entropy"},
                    "medvl": {"ssim_vq_ceiling"}}  # fmt: skip


def test_every_registered_task_rescores():
    """Completeness: a task added to the registry must say how to rescore resamples of its test items."""
    missing = [name for name in TASK_NAMES if tasks.get(name).rescore is Task.rescore]
    assert not missing, f"tasks without Task.rescore: {missing}"


@pytest.mark.parametrize("name", TASK_NAMES)
def test_rescoring_every_test_item_once_reproduces_evaluate(name):
    task = tasks.get(name)()
    raw = task.read(None, 0)
    model = task.load_model(None)
    sizes = {"rmd17": (5, 5), "features": (60, 20), "csbm": (1, 1)}.get(name, (8, 4))
    data, _ = task.prepare(model, raw, *sizes, seed=0)
    test = list(data.test)[:40]
    if name == "medvl":  # three records of every sub-task: answers, reports and generated images
        kinds = sorted({item.task for item in data.test})
        test = [item for kind in kinds for item in [i for i in data.test if i.task == kind][:3]]
    evaluation = task.evaluate(model, test, torch.device("cpu"))
    assert evaluation.groups is not None and evaluation.groups.ndim == 1
    n_items = len(evaluation.groups)
    rescored = task.rescore(evaluation.predictions, np.ones((1, n_items), np.int64))
    expected = {k: v for k, v in evaluation.metrics.items() if k not in NOT_ITEM_METRICS.get(name, set())}
    assert set(rescored) == set(expected)
    tolerance = 1e-5 if name == "medvl" else 1e-9  # medvl: SSIM and PSNR of float32 images
    for metric, value in expected.items():
        assert rescored[metric].shape == (1,)
        assert rescored[metric][0] == pytest.approx(value, rel=tolerance, abs=tolerance), metric
    counts = item_bootstrap.resample_counts(evaluation.groups, np.random.default_rng(0), 30)
    assert all(values.shape == (30,) for values in task.rescore(evaluation.predictions, counts).values())


def test_a_resample_of_frames_brings_each_drawn_frame_s_atoms_as_often_as_it_is_drawn():
    rng = np.random.default_rng(12)
    n_atoms = np.array([3, 5, 2, 4])
    frame = np.repeat(np.arange(4), n_atoms)
    predictions = {"energy_ref_ev": rng.normal(size=4), "energy_pred_ev": rng.normal(size=4),
                   "forces_ref_ev_per_a": rng.normal(size=(14, 3)), "forces_pred_ev_per_a": rng.normal(size=(14, 3)),
                   "forces_frame": frame}  # fmt: skip
    draw = np.array([1, 1, 3, 0])
    counts = np.bincount(draw, minlength=4)[None, :]
    found = tasks.get("rmd17")().rescore(predictions, counts)
    atoms = np.concatenate([np.flatnonzero(frame == f) for f in draw])
    df = (predictions["forces_pred_ev_per_a"] - predictions["forces_ref_ev_per_a"])[atoms] * 1000
    de = (predictions["energy_pred_ev"] - predictions["energy_ref_ev"])[draw] * 1000
    assert found["forces_mae_mev_per_a"][0] == pytest.approx(np.abs(df).mean())
    assert found["forces_rmse_mev_per_a"][0] == pytest.approx(np.sqrt((df**2).mean()))
    assert found["energy_rmse_mev"][0] == pytest.approx(np.sqrt((de**2).mean()))
    assert found["energy_mae_mev_per_atom"][0] == pytest.approx(np.abs(de / n_atoms[draw]).mean())


# ------------------------------------------------------------------------------------------------------ the table
def _metrics(low, high):
    cost = {"trainable_parameters": 10, "seconds_per_epoch": 0.1, "training_step_bytes": None, "epochs": 2,
            "best_epoch": 1}  # fmt: skip
    return {
        "task": "ptbxl", "method": "lora", "samples": {"train": 34, "val": 8, "test": 18},
        "before": {"auc": 0.6}, "after": {"auc": 0.7}, "baselines": {"full": {"auc": 0.75}, "readout": {"auc": 0.5}},
        "costs": {"lora": cost, "full": cost, "readout": cost},
        "test_units": {"items": 18, "groups": 12, "item_kind": "record", "group_kind": "patient", "resamples": 1000},
        "intervals": {"before": {"auc": [0.5, 0.7]}, "after": {"auc": [0.6, 0.8]}, "full": {"auc": None},
                      "readout": {"auc": [0.4, 0.6]}},
        "differences": {"after − before": {"auc": {"estimate": 0.1, "low": 0.01, "high": 0.2}},
                        "lora − full": {"auc": {"estimate": -0.05, "low": low, "high": high}},
                        "lora − readout": {"auc": {"estimate": 0.2, "low": 0.1, "high": 0.3}}},
    }  # fmt: skip


def test_the_table_shows_intervals_the_test_size_and_a_caution_when_the_best_baseline_is_not_told_apart():
    text = report.table(_metrics(-0.15, 0.04), ("auc",), default_method="lora")
    lines = text.splitlines()
    assert lines[0] == "ptbxl: test split (18 records from 12 patients; trained on 34)"
    assert any(line.startswith("lora (task's default method)  0.70 [0.60, 0.80]") for line in lines)
    assert any(line.startswith("full") and " 0.75 " in line and "[" not in line for line in lines)  # no interval
    said = " ".join(lines[-3:-1])
    assert said.startswith("lora and full (the best baseline) cannot be told apart in auc (higher is better): lora − "
                           "full = -0.050, 95 % interval [-0.150, +0.040] over 18 records from 12 patients")
    assert lines[-1] == "  `workbench compare --domain ptbxl --methods lora,full --seeds 200-202`"
    told_apart = report.table(_metrics(-0.15, -0.01), ("auc",), default_method="htuning")
    assert "cannot be told apart" not in told_apart and "lora (this run's method)" in told_apart
    assert "lora is worse than full (the best baseline)" in told_apart
    assert "lora − readout" not in text  # only the best baseline is compared


def test_report_md_has_the_paired_differences_and_the_caution():
    import types

    from workbench.core.config import RunRequest, resolve_config

    config = resolve_config(RunRequest(domain="features", out="x"))[0]
    text = report.markdown(config, types.SimpleNamespace(source="x"), _metrics(-0.15, 0.04), [], ("auc",),
                           default_method="lora")  # fmt: skip
    assert "| lora (task's default method) | 0.700 [0.600, 0.800] |" in text
    assert "## Paired differences" in text
    assert "| lora − full | -0.050 [-0.150, +0.040] |" in text
    assert "| after − before | +0.100 [+0.010, +0.200] |" in text
    assert "**lora and full (the best baseline) cannot be told apart in auc" in text


# ---------------------------------------------------------------------------------------------------------- a run
def test_a_run_writes_intervals_and_resume_rebuilds_them_from_the_saved_predictions(tmp_path):
    import json

    import workbench as wb
    from workbench.run import adapting as run_module

    finished = wb.adapt(domain="features", out=str(tmp_path / "run"), epochs=2, train_size=200, quiet=True)
    written = json.loads((finished.path / "metrics.json").read_text())
    assert written["test_units"] == {"items": written["samples"]["test"], "groups": written["samples"]["test"],
                                     "item_kind": "target row", "group_kind": "target row", "resamples": 1000,
                                     "resampled": "groups"}  # fmt: skip
    assert set(written["intervals"]) == {"before", "after", "pada", "full", "oracle"}
    assert set(written["differences"]) == {"after − before", "warmpot − pada", "warmpot − full", "warmpot − oracle"}
    low, high = written["intervals"]["after"]["accuracy"]
    assert low <= written["after"]["accuracy"] <= high and "outlier_weight_share" not in written["intervals"]["after"]
    difference = written["differences"]["warmpot − full"]["accuracy"]
    full = written["baselines"]["full"]["accuracy"]
    assert difference["estimate"] == pytest.approx(written["after"]["accuracy"] - full)
    # --resume rebuilds them from results/*.predictions.safetensors (groups included)
    config = finished.config
    evaluations = {name: run_module._load_result(finished.path, name)[1] for name in ["before", *map(str,
                   config.entries())]}  # fmt: skip
    task = tasks.get(config.task)(**config.task_options)
    assert run_module._item_intervals(task, config, evaluations) == {
        key: written[key] for key in ("test_units", "intervals", "differences")
    }
    row = (finished.path / "report.md").read_text().split("| warmpot (task's default method) |")[1].split("\n")[0]
    assert f"{written['after']['accuracy']:.3f} [{low:.3f}, {high:.3f}]" in row
