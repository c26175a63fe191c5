"""A stage that holds a teacher frozen in eval mode and trains two parameter groups at their own learning rates
(`workbench.core.method.Stage.frozen`, `Stage.learning_rates`): a toy method defined here uses both, through the
engine's own stage runner and, registered by an entry point as a third party would, through ``workbench adapt``."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.task import TaskData
from workbench.core.trainer import Trainer, TrainSettings
from workbench.run.stages import train_stages

TOY = Path(__file__).parent / "data" / "toy_plugins"
#: The head learns this many times faster than the rest of the student.
HEAD_SPEEDUP = 10.0


def make_teacher(in_features: int) -> nn.Sequential:
    """A fixed teacher with batch norm (running statistics away from 0 and 1) and dropout, the same every call."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        teacher = nn.Sequential(nn.Linear(in_features, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 1))
    teacher[1].running_mean.fill_(0.3)
    teacher[1].running_var.fill_(2.0)
    return teacher


class TeacherStudent(nn.Module):
    """The adapted model (``student``) beside a teacher; the output is the student's."""

    def __init__(self, student: nn.Module, in_features: int):
        super().__init__()
        self.student = student
        self.teacher = make_teacher(in_features)
        self.workbench_spec = student.workbench_spec

    def forward(self, x):
        return self.student(x)


def distil_loss(model: TeacherStudent, batch, training: bool = True) -> torch.Tensor:
    """MSE to the labels plus MSE to the teacher's outputs, differentiated through the teacher too."""
    x, y = batch
    prediction = model(x)[:, 0]
    return F.mse_loss(prediction, y) + F.mse_loss(prediction, model.teacher(x)[:, 0])


class TeacherDistill(Method):
    """Toy: fit the labels and a teacher's outputs; the student's head at ``HEAD_SPEEDUP`` × the learning rate.

    ``prepare`` leaves the teacher trainable and its loss differentiates through the teacher: only the stage's
    ``frozen`` keeps it fixed and in eval mode. Every training forward records the teacher's modes (``modes``)."""

    name = "toy-teacher"
    description = "toy: distil a frozen teacher (batch norm, dropout) into a student whose head learns faster"
    learning_rate = 1e-2

    def prepare(self, model):
        return TeacherStudent(model, model.architecture["in_features"])

    def plan(self, task, model, data, inputs):
        self.modes: list[list[bool]] = []
        rates = {"student.head.*": HEAD_SPEEDUP * inputs.settings.learning_rate}
        loss = partial(self.loss, task)
        return [Stage("distil", data.train, data.val, inputs.settings, loss, frozen=("teacher",), learning_rates=rates)]

    def loss(self, task, model, batch, training):
        if training:
            self.modes.append([module.training for module in model.teacher.modules()])
        return distil_loss(model, batch)

    def merge(self, model):
        return model.student


class Student(nn.Module):
    """x (batch, 3) → body → head → (batch, 1), in float64 (the names the toy method's learning rates match)."""

    workbench_spec = None

    def __init__(self):
        super().__init__()
        self.architecture = {"in_features": 3}
        with torch.random.fork_rng():
            torch.manual_seed(1)
            self.body = nn.Linear(3, 8)
            self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.body(x))


def samples(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 1
    return list(zip(x, y))


class RegressionTask:
    @staticmethod
    def collate(batch, device):
        return torch.stack([x for x, _ in batch]).to(device), torch.stack([y for _, y in batch]).to(device)


DATA = TaskData(train=samples(16, 0), val=samples(8, 1), test=[], source="test")
SETTINGS = TrainSettings(epochs=3, batch_size=4, learning_rate=1e-2, ema_decay=None, clip_grad_norm=None)


def prepared() -> tuple[TeacherDistill, TeacherStudent]:
    method = TeacherDistill()
    return method, method.prepare(Student()).double()


def test_the_teacher_stays_in_eval_mode_and_never_changes(tmp_path):
    method, model = prepared()
    teacher_before = copy.deepcopy(model.teacher.state_dict())  # weights and batch-norm running statistics
    student_before = copy.deepcopy(model.student.state_dict())
    stages = method.plan(RegressionTask(), model, DATA, PlanInputs(SETTINGS))
    history = train_stages(stages, RegressionTask(), model, tmp_path / "m.pt", "cpu", False, "m", False)
    assert len(history) == 3 and len(method.modes) == 3 * 4  # 3 epochs of 4 steps
    assert not any(any(step) for step in method.modes)  # every teacher module in eval mode in every step
    after = model.teacher.state_dict()
    assert all(torch.equal(after[name], value) for name, value in teacher_before.items())
    assert not torch.equal(model.student.head.weight, student_before["head.weight"])
    assert all(p.requires_grad for p in model.teacher.parameters())  # as prepare left them, for the next stage

    # the control: without `frozen` the same plan trains the teacher and moves its running statistics
    method, model = prepared()
    stages = [replace(stage, frozen=()) for stage in method.plan(RegressionTask(), model, DATA, PlanInputs(SETTINGS))]
    train_stages(stages, RegressionTask(), model, tmp_path / "control.pt", "cpu", False, "control", False)
    assert all(all(step) for step in method.modes)
    assert not torch.equal(model.teacher[0].weight, teacher_before["0.weight"])
    assert not torch.equal(model.teacher[1].running_mean, teacher_before["1.running_mean"])


def test_one_step_moves_each_group_by_its_own_rate(tmp_path):
    """One step of Adam (AMSGrad, no weight decay) from fresh moments moves each parameter by exactly
    ``−lr · g / (|g| + eps)``: ``m̂ = g``, ``v̂ = g²`` after the bias corrections. Each group's ``lr`` shows in it."""
    method, model = prepared()
    start = copy.deepcopy(model)
    settings = replace(SETTINGS, epochs=1, batch_size=16)  # one batch: one step
    stages = method.plan(RegressionTask(), model, DATA, PlanInputs(settings))
    train_stages(stages, RegressionTask(), model, tmp_path / "m.pt", "cpu", False, "m", False)

    start.train()
    start.teacher.eval()
    method.loss(None, start, RegressionTask.collate(DATA.train, "cpu"), True).backward()
    rates = {"body": settings.learning_rate, "head": HEAD_SPEEDUP * settings.learning_rate}
    for name, p in start.student.named_parameters():
        expected = p - rates[name.split(".")[0]] * p.grad / (p.grad.abs() + 1e-8)
        torch.testing.assert_close(model.student.get_parameter(name), expected, rtol=0, atol=1e-12)
        assert not torch.equal(expected, p)
    assert all(p.grad is not None for p in start.teacher.parameters())  # the teacher had a gradient, unused


def test_a_linear_schedule_scales_every_group_by_the_same_factor():
    _, model = prepared()
    settings = replace(SETTINGS, epochs=2, schedule="linear", warmup_share=0.5)
    rates = {"student.head.*": HEAD_SPEEDUP * settings.learning_rate}
    seen: list[list[tuple[str, float]]] = []

    def record(model, optimizer, step):
        seen.append([(group["name"], group["lr"]) for group in optimizer.param_groups])

    trainer = Trainer(model, distil_loss, RegressionTask.collate, DATA.train, DATA.val, settings, progress=False,
                      before_step=record, frozen=("teacher",), learning_rates=rates)  # fmt: skip
    history = trainer.fit()
    total, warmup = 8, 4  # 2 epochs of 4 steps, half of them warming up
    factors = [step / warmup if step < warmup else (total - step) / (total - warmup) for step in range(total)]
    assert [[name for name, _ in step] for step in seen] == [["*", "student.head.*"]] * total
    for step, factor in zip(seen, factors):
        assert [lr for _, lr in step] == pytest.approx([factor * 1e-2, factor * 1e-1], rel=1e-12, abs=1e-15)
    assert [h["learning_rates"] for h in history] == [
        {"*": pytest.approx(lr), "student.head.*": pytest.approx(HEAD_SPEEDUP * lr)} for lr in (1e-2, 0.0)
    ]  # after 4 steps the warm-up is over (factor 1); after 8 the decay reached 0
    assert [h["lr"] for h in history] == pytest.approx([1e-2, 0.0])


def test_a_run_killed_mid_stage_resumes_both_groups_bit_for_bit(tmp_path):
    """The checkpoint holds each group's rate and moments: killed in epoch 2 and resumed, the same weights as a run
    left alone, the teacher unchanged in both."""
    settings = replace(SETTINGS, schedule="linear", warmup_share=0.25)
    rates = {"student.head.*": HEAD_SPEEDUP * settings.learning_rate}

    def fit(model, loss, resume):
        return Trainer(model, loss, RegressionTask.collate, DATA.train, DATA.val, settings, tmp_path / "state.pt",
                       progress=False, frozen=("teacher",), learning_rates=rates).fit(resume)  # fmt: skip

    _, whole = prepared()
    fit(whole, distil_loss, False)
    steps = {"n": 0}

    def dies_in_epoch_two(model, batch, training):
        steps["n"] += training
        if steps["n"] == 4 + 2:  # 4 steps per epoch: the 2nd step of epoch 2
            raise RuntimeError("killed")
        return distil_loss(model, batch)

    (tmp_path / "state.pt").unlink()
    _, resumed = prepared()
    with pytest.raises(RuntimeError, match="killed"):
        fit(resumed, dies_in_epoch_two, False)
    assert all(p.requires_grad for p in resumed.teacher.parameters())  # given back though the fit failed
    _, resumed = prepared()
    assert len(fit(resumed, distil_loss, True)) == settings.epochs
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0)
    torch.testing.assert_close(whole.teacher.state_dict(), make_teacher(3).double().state_dict(), rtol=0, atol=0)

def test_a_stage_without_the_new_fields_trains_one_group_as_before():
    _, model = prepared()
    trainer = Trainer(model, distil_loss, RegressionTask.collate, DATA.train, DATA.val, replace(SETTINGS, epochs=1),
                      progress=False)  # fmt: skip
    assert len(trainer.optimizer.param_groups) == 1 and "name" not in trainer.optimizer.param_groups[0]
    assert "learning_rates" not in trainer.fit()[0]
    assert len(trainer.params) == len(list(model.parameters()))  # the teacher trains too: nothing held frozen


def test_an_external_teacher_is_frozen_for_the_fit_and_given_back_as_it_was():
    """A module outside the model (distillation's teacher) is held too, and restored afterwards."""
    _, model = prepared()
    outside = make_teacher(3).double().train()

    def loss(model, batch, training):
        x, y = batch
        assert not outside.training and not any(p.requires_grad for p in outside.parameters())
        return F.mse_loss(model(x)[:, 0], outside(x)[:, 0])

    before = copy.deepcopy(outside.state_dict())
    Trainer(model.student, loss, RegressionTask.collate, DATA.train, DATA.val, replace(SETTINGS, epochs=1),
            progress=False, frozen=(outside,)).fit()  # fmt: skip
    assert outside.training and all(p.requires_grad for p in outside.parameters())
    assert all(torch.equal(outside.state_dict()[name], value) for name, value in before.items())


@pytest.mark.parametrize(
    "options, message",
    [
        ({"frozen": ("teachr",)}, "no submodule 'teachr'"),
        ({"learning_rates": {"student.neck.*": 0.1}}, "['student.neck.*'] match no trained parameter"),
        ({"learning_rates": {"student.head.*": -0.1}}, "finite numbers >= 0"),
    ],
    ids=["frozen-name", "pattern", "rate"],
)
def test_a_stage_naming_what_is_not_there_is_refused(options, message):
    _, model = prepared()
    with pytest.raises(ValueError, match=re.escape(message)):
        Trainer(model, distil_loss, RegressionTask.collate, DATA.train, DATA.val, SETTINGS, progress=False, **options)


def test_a_third_party_method_with_a_teacher_and_two_rates_runs_end_to_end(tmp_path):
    """Registered through an entry point, as a third party's method is, and run by ``workbench adapt`` on the toy
    domain: no engine change; the saved adapter (it holds the teacher, which ``prepare`` left trainable) keeps the
    teacher's weights, and the history records both groups' rates."""
    plugin = tmp_path / "plugin"
    (plugin / "toy_teacher-0.1.dist-info").mkdir(parents=True)
    (plugin / "toy_teacher.py").write_text(
        "from test_stage_teacher_groups import TeacherDistill\nfrom workbench.core.registry import methods\n\n"
        "methods.register(TeacherDistill)\n"
    )
    (plugin / "toy_teacher-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-teacher\n"
                                                                    "Version: 0.1\n")  # fmt: skip
    (plugin / "toy_teacher-0.1.dist-info" / "entry_points.txt").write_text(
        "[workbench.methods]\ntoy-teacher = toy_teacher\n"
    )
    path = os.pathsep.join([str(plugin), str(TOY), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    argv = ["adapt", "--domain", "toy-shift", "--method", "toy-teacher", "--baselines", "", "--epochs", "2",
            "--threads", "1", "--quiet", "--out", str(tmp_path / "run")]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "workbench", *argv], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path}, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    adapter = load_file(tmp_path / "run" / "adapter.safetensors")
    teacher = make_teacher(3)
    for name, value in teacher.named_parameters():
        assert torch.equal(adapter[f"teacher.{name}"], value.detach())
    history = json.loads((tmp_path / "run" / "results" / "toy-teacher.json").read_text())["history"]
    assert len(history) == 2
    for epoch in history:
        head = pytest.approx(HEAD_SPEEDUP * epoch["lr"])
        assert epoch["learning_rates"] == {"*": epoch["lr"], "student.head.*": head} and epoch["lr"] > 0
