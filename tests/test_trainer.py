"""The trainer on a small regression: it learns, keeps the best weights, stops early, resumes exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.task import TaskData
from workbench.core.trainer import Trainer, TrainSettings
from workbench.run.stages import best_epoch, train_stages


def regression(n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64) + 0.01 * torch.randn(
        n, generator=generator, dtype=torch.float64
    )
    return [(x[i], y[i]) for i in range(n)]


def collate(samples, device):
    return torch.stack([s[0] for s in samples]).to(device), torch.stack([s[1] for s in samples]).to(device)


def mse(model, batch, training):
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


def fresh_model():
    torch.manual_seed(0)
    return nn.Linear(4, 1).double()


SETTINGS = TrainSettings(epochs=12, batch_size=4, learning_rate=0.05, ema_decay=0.9, patience=50)


def test_learns_and_keeps_best_weights():
    model = fresh_model()
    trainer = Trainer(model, mse, collate, regression(32, 1), regression(8, 2), SETTINGS, progress=False)
    history = trainer.fit()
    assert history[-1]["val_loss"] < 0.2 * history[0]["val_loss"]
    assert trainer.validation_loss() == pytest.approx(min(h["val_loss"] for h in history))


def test_early_stopping():
    settings = TrainSettings(epochs=20, batch_size=4, learning_rate=0.0, patience=3, ema_decay=None)
    trainer = Trainer(fresh_model(), mse, collate, regression(16, 1), regression(8, 2), settings, progress=False)
    assert len(trainer.fit()) == 4 and trainer.stopped  # epoch 0 is best; 3 more without improvement


def test_epochs_before_select_from_are_neither_chosen_nor_counted():
    calls = {"validation": 0}

    def worse_every_epoch(model, batch, training):  # the validation loss grows every epoch: epoch 0 would win
        calls["validation"] += not training
        return mse(model, batch, training) + (0.0 if training else 10.0 * calls["validation"])

    settings = TrainSettings(
        epochs=20, batch_size=4, learning_rate=0.01, ema_decay=None, patience=3, lr_patience=1, select_from=5
    )
    train, val = regression(16, 1), regression(8, 2)
    trainer = Trainer(fresh_model(), worse_every_epoch, collate, train, val, settings, progress=False)
    history = trainer.fit()
    assert trainer.best["epoch"] == 5 and len(history) == 9  # 5 warm-up epochs, the first selectable, 3 worse
    assert [h["selectable"] for h in history] == [False] * 5 + [True] * 4
    assert [h["lr"] for h in history] == [0.01] * 7 + [0.005] * 2  # the plateau schedule starts at epoch 5 too
    assert best_epoch([dict(h, stage="train") for h in history]) == 5
    never = Trainer(
        fresh_model(), mse, collate, train, val, replace(settings, epochs=3, select_from=50), progress=False
    )
    history = never.fit()
    assert never.best["epoch"] == -1 and best_epoch([dict(h, stage="train") for h in history]) == 2


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("settings", [SETTINGS, replace(SETTINGS, schedule="linear", warmup_share=0.1)],
                         ids=["plateau", "linear"])  # fmt: skip
def test_resume_after_interruption_gives_identical_weights(tmp_path, settings):
    train, val = regression(32, 1), regression(8, 2)
    whole = fresh_model()
    Trainer(whole, mse, collate, train, val, settings, progress=False).fit()

    calls = {"n": 0}

    def dies_in_epoch_six(model, batch, training):
        calls["n"] += training
        if calls["n"] == 5 * 8 + 3:  # 8 steps per epoch: the 3rd step of epoch 6
            raise Interrupt
        return mse(model, batch, training)

    checkpoint = tmp_path / "state.pt"
    with pytest.raises(Interrupt):
        Trainer(fresh_model(), dies_in_epoch_six, collate, train, val, settings, checkpoint, progress=False).fit()
    resumed = fresh_model()
    trainer = Trainer(resumed, mse, collate, train, val, settings, checkpoint, progress=False)
    history = trainer.fit(resume=True)
    assert len(history) == settings.epochs
    torch.testing.assert_close(resumed.weight, whole.weight, rtol=0, atol=0)
    torch.testing.assert_close(resumed.bias, whole.bias, rtol=0, atol=0)


def test_resume_restores_every_random_generator(tmp_path):
    """Dropout (torch's global generator) and noise from NumPy's and Python's global generators: a run interrupted
    mid-epoch and resumed in the same process (whose generators have moved on) equals the uninterrupted one bit for
    bit, because the checkpoint carries every generator's state (`workbench.core.randomness`)."""
    import random

    import numpy as np

    from workbench.core.randomness import seed_all

    def noisy_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Dropout(0.3), nn.Linear(4, 1)).double()

    def noisy_mse(model, batch, training, calls=None):
        x, y = batch
        jitter = float(np.random.normal(0, 0.01)) + random.gauss(0, 0.01) if training else 0.0
        return ((model(x).squeeze(-1) - y) ** 2).mean() + jitter

    train, val = regression(32, 1), regression(8, 2)
    seed_all(0)
    whole = noisy_model()
    Trainer(whole, noisy_mse, collate, train, val, SETTINGS, progress=False).fit()

    calls = {"n": 0}

    def dies_in_epoch_six(model, batch, training):
        calls["n"] += training
        if calls["n"] == 5 * 8 + 3:
            raise Interrupt
        return noisy_mse(model, batch, training)

    seed_all(0)
    checkpoint = tmp_path / "state.pt"
    with pytest.raises(Interrupt):
        Trainer(noisy_model(), dies_in_epoch_six, collate, train, val, SETTINGS, checkpoint, progress=False).fit()
    resumed = noisy_model()  # draws again from torch's generator: a resume without saved states would differ
    Trainer(resumed, noisy_mse, collate, train, val, SETTINGS, checkpoint, progress=False).fit(resume=True)
    for got, expected in zip(resumed.parameters(), whole.parameters()):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_checkpoint_of_other_settings_is_refused(tmp_path):
    train, val = regression(16, 1), regression(8, 2)
    Trainer(fresh_model(), mse, collate, train, val, SETTINGS, tmp_path / "state.pt", progress=False).fit()
    other = TrainSettings(epochs=12, batch_size=4, learning_rate=0.01)
    with pytest.raises(ValueError, match="does not match"):
        Trainer(fresh_model(), mse, collate, train, val, other, tmp_path / "state.pt", progress=False).fit(resume=True)


def test_needs_trainable_parameters_and_a_full_batch():
    frozen = fresh_model().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        Trainer(frozen, mse, collate, regression(8, 1), regression(4, 2), SETTINGS, progress=False)
    with pytest.raises(ValueError, match="cannot fill one batch"):
        Trainer(fresh_model(), mse, collate, regression(2, 1), regression(4, 2), SETTINGS, progress=False)


def test_ema_matches_the_torch_ema_package():
    """The engine's EMA gives torch-ema's averages step for step (same warm-up schedule)."""
    torch_ema = pytest.importorskip("torch_ema")
    from workbench.core.ema import ExponentialMovingAverage

    generator = torch.Generator().manual_seed(0)
    ours_param = nn.Parameter(torch.randn(5, generator=generator, dtype=torch.float64))
    their_param = nn.Parameter(ours_param.detach().clone())
    ours = ExponentialMovingAverage([ours_param], decay=0.99)
    theirs = torch_ema.ExponentialMovingAverage([their_param], decay=0.99)
    for _ in range(30):
        step = torch.randn(5, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            ours_param.add_(step)
            their_param.add_(step)
        ours.update()
        theirs.update()
    raw = ours_param.detach().clone()
    with ours.average_parameters(), theirs.average_parameters():
        torch.testing.assert_close(ours_param.detach(), their_param.detach(), rtol=0, atol=1e-15)
        assert (ours_param.detach() - raw).abs().max() > 0.1  # the average is not the last value
    assert torch.equal(ours_param.detach(), raw)  # restored afterwards
    state = ours.state_dict()
    fresh = ExponentialMovingAverage([nn.Parameter(torch.zeros(5, dtype=torch.float64))], decay=0.5)
    fresh.load_state_dict(state)
    assert fresh.num_updates == 30 and torch.equal(fresh.shadow[0], ours.shadow[0])


class TwoStages(Method):
    """A method trained in two stages: the weight alone on the first half of the samples, then the bias alone."""

    name = "two-stages"
    description = "test"

    def prepare(self, model):
        return model

    def plan(self, task, model, data, inputs):
        loss, settings, half = task.loss, inputs.settings, data.train[: len(data.train) // 2]
        return [
            Stage("weight", half, data.val, replace(settings, epochs=3), loss, {"weight"}),
            Stage("bias", data.train, data.val, replace(settings, epochs=2), loss, {"bias"}),
        ]


class RegressionTask:
    collate = staticmethod(collate)

    def loss(self, model, batch, training):
        return mse(model, batch, training)


def test_a_method_in_stages_trains_each_stage_with_its_own_parameters_samples_and_settings(tmp_path):
    data = TaskData(train=regression(32, 1), val=regression(8, 2), test=[], source="test")
    model, method = fresh_model(), TwoStages()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    task = RegressionTask()
    stages = method.plan(task, model, data, PlanInputs(SETTINGS))
    history = train_stages(stages, task, model, tmp_path / "m.pt", "cpu", False, "m", False)
    assert [(h["epoch"], h["stage"], h["stage_epoch"]) for h in history] == [
        (0, "weight", 0), (1, "weight", 1), (2, "weight", 2), (3, "bias", 0), (4, "bias", 1),
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bias.pt", "m.weight.pt"]
    assert not torch.equal(model.weight, start["weight"]) and not torch.equal(model.bias, start["bias"])
    assert best_epoch(history) in (3, 4)  # chosen within the last stage
    again = fresh_model()  # resumed from the finished stages' checkpoints: the same weights
    stages = TwoStages().plan(task, again, data, PlanInputs(SETTINGS))
    train_stages(stages, task, again, tmp_path / "m.pt", "cpu", False, "m", True)
    assert torch.equal(again.weight, model.weight) and torch.equal(again.bias, model.bias)


def test_linear_schedule_matches_transformers_warmup_then_linear_decay():
    """--schedule linear follows transformers' get_linear_schedule_with_warmup step for step (the reference)."""
    from transformers import get_linear_schedule_with_warmup

    train = regression(12, 1)
    settings = TrainSettings(epochs=6, batch_size=4, learning_rate=0.05, ema_decay=None, patience=50,
                             schedule="linear", warmup_share=0.2)  # fmt: skip
    seen: list[float] = []

    def recording_mse(model, batch, training):  # the rate each optimizer step uses
        if training:
            seen.append(trainer.optimizer.param_groups[0]["lr"])
        return mse(model, batch, training)

    trainer = Trainer(fresh_model(), recording_mse, collate, train, regression(8, 2), settings, progress=False)
    trainer.fit()
    total = 6 * 3  # epochs × steps per epoch
    reference_optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.05)
    reference = get_linear_schedule_with_warmup(reference_optimizer, num_warmup_steps=int(0.2 * total),
                                                num_training_steps=total)  # fmt: skip
    expected = []
    for _ in range(total):
        expected.append(reference_optimizer.param_groups[0]["lr"])
        reference_optimizer.step()
        reference.step()
    assert seen == pytest.approx(expected, abs=1e-15)
    assert seen[0] == 0.0 and max(seen) == pytest.approx(0.05) and seen[-1] < seen[total // 2]


def test_selection_on_a_metric_chooses_its_best_epoch_and_stops_on_it():
    """select_on a metric: the epoch of the best score (not of the best loss) is kept, and patience counts score."""
    objectives = iter([3.0, 1.0, 2.0, 5.0, 4.0, 0.0])  # lower is better; epoch 1 is best until patience runs out
    kept: list[torch.Tensor] = []

    def score(model):
        kept.append(model.weight.detach().clone())
        return next(objectives)

    settings = TrainSettings(epochs=6, batch_size=4, learning_rate=0.05, ema_decay=None, patience=3,
                             select_on="balanced_accuracy")  # fmt: skip
    model = fresh_model()
    trainer = Trainer(model, mse, collate, regression(16, 1), regression(8, 2), settings, progress=False,
                      score=score)  # fmt: skip
    history = trainer.fit()
    assert [h["objective"] for h in history] == [3.0, 1.0, 2.0, 5.0, 4.0]  # stopped 3 epochs after epoch 1
    assert trainer.stopped and torch.equal(model.weight, kept[1])
    assert min(history, key=lambda h: h["val_loss"])["epoch"] != 1  # the loss alone would have kept another epoch
    assert best_epoch([dict(h, stage="train") for h in history]) == 1
    with pytest.raises(ValueError, match="needs a score"):
        Trainer(fresh_model(), mse, collate, regression(16, 1), regression(8, 2), settings, progress=False)


class ScoredRegressionTask(RegressionTask):
    """A task whose metric (R², higher is better) needs at least two samples, as AUROC or R² do."""

    lower_is_better = frozenset()

    def evaluate(self, model, samples, device):
        from workbench.core.task import Evaluation

        if len(samples) < 2:
            raise ValueError("R² needs at least two samples")
        x, y = collate(samples, device)
        with torch.no_grad():
            residual = ((model(x).squeeze(-1) - y) ** 2).sum()
        return Evaluation({"r2": float(1 - residual / ((y - y.mean()) ** 2).sum())}, {})


def test_a_stage_selecting_on_a_metric_keeps_its_best_epoch_and_its_memory_probe_selects_nothing(tmp_path):
    from workbench.run.stages import step_bytes
    data = TaskData(train=regression(32, 1), val=regression(8, 2), test=[], source="test")
    task, model = ScoredRegressionTask(), fresh_model()
    settings = replace(SETTINGS, epochs=4, select_on="r2")
    stages = [Stage("train", data.train, data.val, settings, task.loss)]
    history = train_stages(stages, task, model, tmp_path / "m.pt", "cpu", False, "m", False)
    best = history[best_epoch(history)]
    assert best["objective"] == min(h["objective"] for h in history)
    assert best["objective"] == pytest.approx(-task.evaluate(model, data.val, "cpu").metrics["r2"], abs=1e-12)
    assert step_bytes(stages[-1], task, model, data, torch.device("cpu")) > 0  # scores no single sample


def test_before_step_sees_each_steps_gradient_before_the_optimizer_uses_it():
    """A stage's ``before_step`` runs once per optimizer step, with the trainer's optimizer, after backward and
    before the update: what it does to the gradient is what the optimizer applies."""
    calls: list[int] = []

    def drop_weight_gradient(model, optimizer, step):
        assert optimizer is trainer.optimizer and model.weight.grad is not None
        calls.append(step)
        model.weight.grad.zero_()  # the update must not move the weight (Adam with zero moments: no change)

    settings = TrainSettings(epochs=2, batch_size=4, learning_rate=0.05, ema_decay=None, patience=50)
    model = fresh_model()
    start = model.weight.detach().clone()
    trainer = Trainer(model, mse, collate, regression(12, 1), regression(8, 2), settings, progress=False,
                      before_step=drop_weight_gradient)  # fmt: skip
    trainer.fit()
    assert calls == list(range(6)) and torch.equal(model.weight, start)
