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

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import UserError
from workbench.method import Method
from workbench.options import Option


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


class Distill(Method):
    """Distillation as a workbench method — a sketch; not registered (add ``@methods.register`` with its task).

    The engine's methods adapt *one* model in place; distillation trains a *new* model against a fixed one,
    so it fits only partly: `prepare` receives the student (built by the task, e.g. ``ECGStudent(n_leads=1)``),
    `set_teacher` must be called with the fine-tuned, merged teacher before training (a task or a
    ``setup`` hook that can reach it), and `loss` assumes a batch ``(ecg, labels)``. A task wiring it needs to
    (1) fine-tune and merge the teacher, (2) build the student, (3) call `set_teacher`, (4) train the student
    with this loss. Teacher logits are recomputed per batch (no cache); the teacher stays in eval mode.
    """

    name = "distill"
    description = "Knowledge distillation: BCE(student, y) + weight · BCE(student, sigmoid(teacher)) (H-Tuning)"
    learning_rate = 1e-3
    options = (Option("weight", float, 1.0, "weight of the teacher (soft-label) BCE term"),)

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.teacher: nn.Module | None = None

    def set_teacher(self, teacher: nn.Module) -> None:
        """The fixed model whose sigmoid outputs the student learns (frozen and put in eval mode)."""
        self.teacher = teacher.eval().requires_grad_(False)

    def prepare(self, model: nn.Module) -> nn.Module:
        """The student trains in full."""
        return model.requires_grad_(True)

    def loss(self, task, model: nn.Module, batch: Any, training: bool) -> torch.Tensor:
        if self.teacher is None:
            raise UserError("method 'distill' has no teacher: call set_teacher(model) before training")
        ecg, labels = batch
        with torch.no_grad():
            teacher_logits = self.teacher(ecg)
        return distillation_loss(model(ecg), teacher_logits, labels, self.config["weight"])
