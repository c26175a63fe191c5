"""Knowledge distillation of a multi-label ECG classifier into a small student, as H-Tuning does.

Paper: "H-Tuning: Toward Low-Cost and Efficient ECG-based Cardiovascular Disease Detection with Pre-Trained
Models", ICML 2025 — after fine-tuning, the teacher's predictions train a small conv + one-transformer-layer
student (optionally on 1 or 3 leads); the paper reports 4.52× lower latency and 19.83× less memory. The
objective (Hinton et al., 2015, with per-class sigmoids instead of a softmax, temperature 1)::

    L = BCE(s, y) + weight · BCE(s, σ(t)),   BCE(s, q) = −mean_{i,k} [q log σ(s) + (1 − q) log(1 − σ(s))]

with student logits ``s``, teacher logits ``t`` (no gradient) and multi-hot labels ``y``. The soft term has its
minimum at ``σ(s) = σ(t)``: the student learns the teacher's calibrated probabilities, not only its labels.

Shapes:
    student_logits, teacher_logits (batch, n_classes); labels (batch, n_classes) multi-hot in {0, 1}.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from workbench.models.ecg import ECGStudent

from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.method import Method, PlanInputs, Stage
from workbench.core.options import Option
from workbench.core.registry import methods

log = logging.getLogger(__name__)


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, weight: float = 1.0
) -> torch.Tensor:
    """``BCE(student, labels) + weight · BCE(student, sigmoid(teacher))``, each a mean over batch and classes.

    Args:
        student_logits: the student's logits (gradients flow into them).
        teacher_logits: the teacher's logits (detached here).
        labels: multi-hot targets.
        weight: weight of the soft (teacher) term (default 1.0, the paper's).

    Shapes:
        student_logits, teacher_logits, labels (batch, n_classes) → ()
    """
    if student_logits.shape != teacher_logits.shape or student_logits.shape != labels.shape:
        raise UserError(
            "distillation_loss: student logits, teacher logits and labels must share one shape (batch, n_classes), "
            f"got {tuple(student_logits.shape)}, {tuple(teacher_logits.shape)}, {tuple(labels.shape)}"
        )
    hard = F.binary_cross_entropy_with_logits(student_logits, labels.to(student_logits.dtype))
    soft = F.binary_cross_entropy_with_logits(student_logits, torch.sigmoid(teacher_logits.detach()))
    return hard + weight * soft


def time_cutmix(ecg: torch.Tensor, low: float = 0.1, high: float = 0.5) -> torch.Tensor:
    """Each record with one time segment (a random ``low``–``high`` share of its length, all leads) replaced by
    the same segment of another record of the batch (a random pairing).

    Shapes:
        ecg (batch, leads, n_samples) → same
    """
    batch, _, n = ecg.shape
    partner = torch.randperm(batch, device=ecg.device)
    length = (torch.empty(batch, device=ecg.device).uniform_(low, high) * n).long()
    start = (torch.rand(batch, device=ecg.device) * (n - length)).long()
    t = torch.arange(n, device=ecg.device)
    inside = (t >= start[:, None]) & (t < (start + length)[:, None])
    return torch.where(inside[:, None, :], ecg[partner], ecg)


@methods.register
class Distill(Method):
    """Distil the run's adapted ECG teacher into a small `ECGStudent` (12, 3 or 1 leads), as H-Tuning does.

    The student is a new model: `prepare` builds it (random init, seeded) with the teacher's classes and record
    length, and everything in it trains. The teacher, frozen and in eval mode, is in order of precedence:

    1. ``--teacher RUN_DIR``: the adapted model of a finished run (``workbench adapt --domain ptbxl`` with
       ``--method htuning``, say) — the clinical path: adapt once, then distil as often as needed;
    2. as a baseline of a run: the model the run's chosen method has just adapted (`PlanInputs.adapted_model`);
    3. otherwise the pretrained base model itself (not adapted to the target; logged).

    ``mix`` > 0 adds ``mix · BCE(s(x̃), σ(t(x̃)))`` on a time-CutMix copy ``x̃`` of each training batch (`time_cutmix`):
    the teacher labels records it never saw whole. On the embedded site 1 (htuning teachers of seeds 0–2), ``mix``
    1 raised 12-lead students' macro AUROC from 0.855 to 0.901, but not 1-lead (0.822 → 0.809) or 3-lead ones
    (0.811 → 0.785, one seed stopping early): off by default.

    The student trains ``epochs_factor`` (3) times the run's epochs: on the embedded target site (34 records) a
    12-lead student reaches macro AUROC 0.75 after 30 epochs and 0.91 after 100. Teacher logits are recomputed
    per batch (no cache). Validation (early stopping) uses the same objective.
    A finished run's adapter is the whole student, so ``workbench predict`` / `Run.load` need no teacher.
    """

    name = "distill"
    description = (
        "Distil the adapted teacher into a small 1/3/12-lead student: BCE to labels + BCE to teacher (H-Tuning)"
    )
    model_families = ("ecg",)
    learning_rate = 1e-3
    options = (
        Option("weight", float, 1.0, "weight of the teacher (soft-label) BCE term"),
        Option("n_leads", int, 12, "leads the student reads (12; 3 = I, II, V2; 1 = I)", choices=(12, 3, 1)),
        Option("mix", float, 0.0, "weight of a soft-label term on time-CutMix copies of each batch (0: off)"),
        Option("epochs_factor", int, 3, "the student (trained from scratch) runs this many times the run's --epochs"),
        Option(
            "teacher",
            str,
            "",
            "a finished run directory whose adapted model is the teacher (default: the model the run's chosen "
            "method adapted, or the base model when distill is the chosen method)",
        ),
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        if self.config["epochs_factor"] < 1:
            raise UserError(f"--epochs-factor must be at least 1, got {self.config['epochs_factor']}")
        self.teacher: nn.Module | None = None
        self._base: nn.Module | None = None

    def check(self, task, data, model) -> None:
        """The ECG family, and a ``--teacher`` that is a finished run whose seal verifies (checked at the start of a
        run only: a finished student reloads without its teacher)."""
        super().check(task, data, model)
        teacher = self.config["teacher"]
        if teacher and not (Path(teacher) / "adapter.json").is_file():
            raise UserError(f"--teacher {teacher}: not a finished run directory (no adapter.json in it)")
        if teacher:
            _verified_teacher(teacher)  # before the run's folder appears; `plan` verifies again when it loads it

    def set_teacher(self, teacher: nn.Module) -> None:
        """The fixed model whose sigmoid outputs the student learns; `plan`'s stage holds it frozen and in eval mode
        (`Stage.frozen`), so a caller of `loss` outside a trainer puts it in eval mode itself."""
        self.teacher = teacher

    def prepare(self, model: nn.Module) -> nn.Module:
        """A fresh `ECGStudent` for ``model``'s classes and record length; ``model`` is kept as the fallback teacher."""
        architecture = getattr(model, "architecture", {})
        if architecture.get("kind") not in ("ecg_encoder", "ecg_student"):
            raise UserError(f"method 'distill' distils ECG models (models.ecg); got a {type(model).__name__}")
        self._base = model
        student = ECGStudent(
            n_chans=self.config["n_leads"], n_outputs=architecture["n_outputs"], n_times=architecture["n_times"]
        )
        return student.to(next(model.parameters()).dtype)

    def plan(self, task, model: nn.Module, data, inputs: PlanInputs) -> list[Stage]:
        """One stage of ``epochs_factor`` times the run's epochs (a student starts from scratch), learning from the
        teacher: ``--teacher``'s adapted model, else the run's chosen adapted model (distill as a baseline), else
        the pretrained base model."""
        if self.config["teacher"]:
            from workbench.core.finished import Run

            self.set_teacher(Run.load(self.config["teacher"], sealed=_verified_teacher(self.config["teacher"])).model)
            log.info("distill: teacher = the adapted model of %s", self.config["teacher"])
        elif inputs.adapted_model is not None:
            self.set_teacher(inputs.adapted_model())
            log.info("distill: teacher = the model the run's chosen method adapted")
        else:
            self.set_teacher(self._base)
            log.info("distill: teacher = the pretrained base model (not adapted; give --teacher RUN_DIR to change)")
        self.teacher.to(device_of(model))
        settings = replace(inputs.settings, epochs=inputs.settings.epochs * self.config["epochs_factor"])
        return [Stage("train", data.train, data.val, settings, partial(self.loss, task), frozen=(self.teacher,))]

    def loss(self, task, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        ecg, labels = batch
        with torch.no_grad():
            teacher_logits = self.teacher(ecg)
        loss = distillation_loss(model(ecg), teacher_logits, labels, self.config["weight"])
        if training and self.config["mix"] > 0:
            mixed = time_cutmix(ecg)
            with torch.no_grad():
                soft = torch.sigmoid(self.teacher(mixed))
            loss = loss + self.config["mix"] * F.binary_cross_entropy_with_logits(model(mixed), soft)
        return loss


def _verified_teacher(path: str) -> dict[str, Any]:
    """What `workbench.core.seal.check_run` says of the ``--teacher`` run: it must verify (a teacher whose adapter
    changed after it finished would teach something nobody trained).

    Raises:
        UserError: naming the teacher and the first problem (a missing or untrusted seal, a changed file).
    """
    from workbench.core.seal import check_run

    return check_run(path, fix="a --teacher is used only when its run verifies against its seal (workbench verify "
                               "RUN)")
