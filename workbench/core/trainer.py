"""One trainer for every task: early stopping, EMA, clipping, atomic checkpoints, resume, DDP.

The task supplies a loss (``loss_fn(model, batch, training) -> scalar``) and a way to turn a list of
samples into a batch (``collate(samples, device)``); the method has already chosen which parameters
train (``requires_grad``). The same code runs single-process and under ``torchrun`` (DDP: each rank
trains on its share of every epoch, gradients are averaged; gloo on CPU, nccl on GPU).

Determinism: epoch ``e`` shuffles with a generator seeded by ``(seed, e)``, and a checkpoint holds every
other piece of state (parameters, optimizer, scheduler, EMA, early-stopping record, and the state of every global
random-number generator of every process, `workbench.core.randomness`), so a run killed after any epoch and resumed
gives the same numbers as one left alone, dropout included.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from workbench.core import randomness
from workbench.core.checkpoint import load_checkpoint, save_checkpoint
from workbench.core.device import device_of
from workbench.core.ema import ExponentialMovingAverage

log = logging.getLogger(__name__)

#: Remaining training time [s] above which a trainer says, after its first epoch, how long the rest will take.
ESTIMATE_ABOVE_S = 60.0


def _duration(seconds: float) -> str:
    """``seconds`` in words: "40 s", "12 min", "2.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings (Adam/AMSGrad, a learning-rate schedule, early stopping on the validation loss or a
    validation metric)."""

    epochs: int = 40
    batch_size: int = 5
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    amsgrad: bool = True
    #: Decay of the exponential moving average of the trained weights; None turns EMA off.
    ema_decay: float | None = 0.99
    #: Largest gradient norm; None turns clipping off.
    clip_grad_norm: float | None = 10.0
    #: Epochs without a better validation objective (`select_on`) before training stops.
    patience: int = 15
    #: One of `SCHEDULES`. "plateau": the learning rate is multiplied by ``lr_factor`` after ``lr_patience`` epochs
    #: without a better validation objective. "linear": per optimizer step, a linear warm-up from 0 over the first
    #: ``warmup_share`` of all ``epochs`` × steps-per-epoch steps, then a linear decay to 0 at the last step
    #: (transformers' ``get_linear_schedule_with_warmup``); early stopping may end it before it reaches 0.
    schedule: str = "plateau"
    lr_factor: float = 0.5
    lr_patience: int = 5
    #: Share of all steps that warm up under the "linear" schedule, in [0, 1).
    warmup_share: float = 0.0
    #: What chooses the best epoch and stops early: "loss" (the validation loss) or the name of a validation metric,
    #: which the trainer's ``score`` computes.
    select_on: str = "loss"
    seed: int = 0
    #: "float32" / "float64": steps in the model's own dtype; "bf16" / "fp16": the loss (and a method's own
    #: gradient passes) under ``torch.autocast`` in that type, backward outside it; fp16 adds loss scaling
    #: (``torch.amp.GradScaler``) so that small gradients do not underflow.
    precision: str = "float32"
    #: First epoch (0-based) whose validation loss can be chosen as the best: earlier ones train and are validated
    #: but neither chosen, nor counted by early stopping or the plateau schedule (a method's warm-up, whose losses
    #: are not comparable with later ones). With no such epoch the weights of the last step stay.
    select_from: int = 0


#: ``TrainSettings.schedule`` values.
SCHEDULES = ("plateau", "linear")

#: The ``TrainSettings.precision`` values trained under autocast, and their dtype.
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def distributed() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside ``torchrun``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Trainer:
    """Fits the trainable parameters of ``model``; leaves the best (EMA) weights in it.

    Args:
        model: a prepared model (its trainable parameters have ``requires_grad``).
        loss_fn: ``loss_fn(model, batch, training) -> scalar tensor`` (mean over the batch).
        collate: ``collate(samples, device) -> batch``.
        train_samples, val_samples: sequences of samples (any objects ``collate`` accepts).
        settings: `TrainSettings`.
        checkpoint_path: written atomically after every epoch (rank 0); read back by ``fit(resume=True)``.
        device: where batches go (default: where the model is, `workbench.core.device.device_of`).
        progress: show a progress bar (rank 0 only).
        label: names the run in the progress bar and the log.
        epoch_start: ``epoch_start(epoch, epochs)`` called before each training epoch (schedules).
        gradients: ``gradients(model, batch, step) -> loss | None``, tried before the usual backward pass at
            global step ``step`` (0, 1, ... over the whole fit; the same after a resume): None keeps
            ``loss_fn(...).backward()``; a (detached) loss means it has filled every trainable ``.grad`` itself
            (`workbench.core.method.Stage.gradients`). Under DDP such gradients are averaged over the processes.
        before_step: ``before_step(model, optimizer, step)`` after the gradients of global step ``step`` are in
            ``.grad`` (unscaled) and before clipping and the optimizer step (`workbench.core.method.Stage.before_step`).
        score: ``score(model) -> float``, the validation objective when ``settings.select_on`` names a metric
            (lower is better: the caller negates a metric where higher is better), computed with the current (EMA)
            weights after each epoch.
        threads: ``threads() -> count`` called before each epoch: the CPU threads it computes with, which the hook
            may change (`workbench.run.threads.ThreadPolicy.update`); None: torch's count as it is. Each epoch's count
            is in the history (``threads``).
        frozen: modules held in eval mode and frozen while the trainer lives (a teacher): names of submodules of
            ``model`` or modules outside it (`workbench.core.method.Stage.frozen`); their parameters never train, and
            their modes and ``requires_grad`` are restored when ``fit`` returns.
        learning_rates: ``{pattern: rate}``, one optimizer group per pattern
            (`workbench.core.method.Stage.learning_rates`); with several groups each epoch's history holds every
            group's rate (``learning_rates``).
        track: ``track(model) -> {split: {metric: value}}``, scored with the current (EMA) weights after each
            epoch and kept in its history (``curves``): learning curves; nothing chooses on them.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any, bool], torch.Tensor],
        collate: Callable[[Sequence[Any], torch.device], Any],
        train_samples: Sequence[Any],
        val_samples: Sequence[Any],
        settings: TrainSettings,
        checkpoint_path: str | Path | None = None,
        device: torch.device | str | None = None,
        progress: bool = True,
        label: str = "train",
        epoch_start: Callable[[int, int], None] | None = None,
        gradients: Callable[[nn.Module, Any, int], torch.Tensor | None] | None = None,
        before_step: Callable[[nn.Module, torch.optim.Optimizer, int], None] | None = None,
        score: Callable[[nn.Module], float] | None = None,
        threads: Callable[[], int] | None = None,
        frozen: Collection[str | nn.Module] = (),
        learning_rates: Mapping[str, float] | None = None,
        track: Callable[[nn.Module], dict[str, dict[str, float]]] | None = None,
    ):
        self.model = model
        self.loss_fn = loss_fn
        self.collate = collate
        self.train_samples = train_samples
        self.val_samples = val_samples
        self.settings = settings
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.device = device_of(model) if device is None else torch.device(device)
        self.label = label
        self.epoch_start, self.gradients, self.before_step = epoch_start, gradients, before_step
        self.score, self.track = score, track
        self.threads = threads or torch.get_num_threads
        self.rank, self.world_size = distributed()
        self.progress = progress and self.rank == 0
        self.frozen = [self._module(module) for module in frozen]
        self._frozen_before = [(p, p.requires_grad) for module in self.frozen for p in module.parameters()]
        self._modes_before = [(m, m.training) for module in self.frozen for m in module.modules()]
        for p, _ in self._frozen_before:  # before DDP wraps the model: it reduces what requires grad then
            p.requires_grad_(False)
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError(f"{label}: the model has no trainable parameters")
        if len(train_samples) < self.world_size * settings.batch_size:
            raise ValueError(
                f"{label}: {len(train_samples)} training samples cannot fill one batch of "
                f"{settings.batch_size} on each of {self.world_size} processes"
            )
        if settings.schedule not in SCHEDULES:
            raise ValueError(f"{label}: schedule must be one of {', '.join(SCHEDULES)}, got {settings.schedule!r}")
        if not 0 <= settings.warmup_share < 1:
            raise ValueError(f"{label}: warmup_share must be in [0, 1), got {settings.warmup_share}")
        if settings.select_on != "loss" and score is None:
            raise ValueError(f"{label}: select_on={settings.select_on!r} needs a score function")
        # fused: one kernel per step for all parameters; on CPU torch's default is a Python loop over them
        # (about ten small operations per tensor), which costs a small model as much as its gradient clipping,
        # EMA and collation together.
        self.optimizer = torch.optim.Adam(
            self._param_groups(learning_rates or {}),
            lr=settings.learning_rate,
            amsgrad=settings.amsgrad,
            weight_decay=settings.weight_decay,
            fused=all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in self.params) or None,
        )
        self.scheduler = self._scheduler()
        self.ema = ExponentialMovingAverage(self.params, decay=settings.ema_decay) if settings.ema_decay else None
        self.autocast_dtype = AUTOCAST.get(settings.precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if settings.precision == "fp16" else None
        self.history: list[dict[str, float]] = []
        self.best: dict[str, Any] = {"objective": float("inf"), "epoch": -1, "state": None}
        self.stopped = False
        self._val_batches: list[tuple[Any, int]] | None = None
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.train_model: nn.Module = DistributedDataParallel(model)
        else:
            self.train_model = model

    def _module(self, module: str | nn.Module) -> nn.Module:
        """A frozen module: ``module`` itself, or the submodule of the model it names."""
        if isinstance(module, nn.Module):
            return module
        try:
            return self.model.get_submodule(module)
        except AttributeError:
            raise ValueError(f"{self.label}: the model has no submodule '{module}' to hold frozen") from None

    def _param_groups(self, learning_rates: Mapping[str, float]) -> list[nn.Parameter] | list[dict[str, Any]]:
        """What the optimizer steps: every trained parameter in one group at the settings' rate, or, with
        ``learning_rates``, the parameters no pattern matches (group ``"*"``, the settings' rate, when there are
        any) then one group per pattern (first match wins; a pattern that matches nothing is an error)."""
        if not learning_rates:
            return self.params
        bad = {pattern: rate for pattern, rate in learning_rates.items()
               if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0}  # fmt: skip
        if bad:
            raise ValueError(f"{self.label}: learning rates must be finite numbers >= 0, got {bad}")
        members: dict[str, list[nn.Parameter]] = {pattern: [] for pattern in learning_rates}
        rest = []
        for name, p in zip(self.names, self.params):
            pattern = next((pattern for pattern in learning_rates if fnmatchcase(name, pattern)), None)
            (rest if pattern is None else members[pattern]).append(p)
        unmatched = [pattern for pattern, params in members.items() if not params]
        if unmatched:
            raise ValueError(
                f"{self.label}: learning-rate pattern(s) {unmatched} match no trained parameter "
                f"(names look like '{self.names[0]}')"
            )
        groups = [{"name": "*", "params": rest, "lr": self.settings.learning_rate}] if rest else []
        return groups + [{"name": name, "params": members[name], "lr": rate} for name, rate in learning_rates.items()]

    def _group_rates(self) -> dict[str, dict[str, float]]:
        """``{"learning_rates": {group: current rate}}`` with several optimizer groups, else nothing."""
        groups = self.optimizer.param_groups
        return {"learning_rates": {group["name"]: group["lr"] for group in groups}} if len(groups) > 1 else {}

    def _release_frozen(self) -> None:
        """The frozen modules' modes and ``requires_grad`` as they were before this trainer."""
        for p, requires_grad in self._frozen_before:
            p.requires_grad_(requires_grad)
        for module, training in self._modes_before:
            module.train(training)

    def _scheduler(self) -> Any:
        """The settings' learning-rate schedule: "plateau" steps once per epoch on the validation objective,
        "linear" once per optimizer step."""
        settings = self.settings
        if settings.schedule == "plateau":
            return torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, factor=settings.lr_factor, patience=settings.lr_patience
            )
        per_rank = len(self.train_samples) // self.world_size
        total = settings.epochs * -(-per_rank // settings.batch_size)
        warmup = int(settings.warmup_share * total)

        def factor(step: int) -> float:
            if step < warmup:
                return step / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)

    # -- one epoch -------------------------------------------------------------------------------
    def _epoch_batches(self, epoch: int) -> list[list[Any]]:
        generator = torch.Generator().manual_seed(self.settings.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.train_samples), generator=generator).tolist()
        per_rank = len(order) // self.world_size  # every rank takes the same number of steps
        mine = order[self.rank * per_rank : (self.rank + 1) * per_rank]
        size = self.settings.batch_size
        return [[self.train_samples[i] for i in mine[start : start + size]] for start in range(0, len(mine), size)]

    def _train_epoch(self, epoch: int) -> tuple[float, int]:
        """(mean training loss, optimizer steps taken) of epoch ``epoch``."""
        self.model.train()
        for module in self.frozen:
            module.eval()
        total, count = 0.0, 0
        batches = self._epoch_batches(epoch)
        for index, samples in enumerate(batches):
            batch = self.collate(samples, self.device)
            self.optimizer.zero_grad(set_to_none=True)
            step = epoch * len(batches) + index  # every epoch has the same number of batches
            with self.autocast():
                loss = None if self.gradients is None else self.gradients(self.model, batch, step)
                own = loss is None
                if own:
                    loss = self.loss_fn(self.train_model, batch, True)
            scaled = own and self.scaler is not None
            if own:
                (self.scaler.scale(loss) if scaled else loss).backward()
            elif self.world_size > 1:  # the method wrote .grad itself: average it as DDP would
                for p in self.params:
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                        p.grad /= self.world_size
            if scaled:
                self.scaler.unscale_(self.optimizer)  # clip the true gradient
            if self.before_step is not None:
                self.before_step(self.model, self.optimizer, step)
            if self.settings.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.params, self.settings.clip_grad_norm)
            if scaled:
                self.scaler.step(self.optimizer)  # skipped when the scaled gradient overflowed
                self.scaler.update()
            else:
                self.optimizer.step()
            if self.settings.schedule == "linear":
                self.scheduler.step()
            if self.ema is not None:
                self.ema.update()
            # summed on the device (no host sync inside the step), as float32 values added in float64 as before
            total = total + loss.detach().float().double() * len(samples)
            count += len(samples)
        return float(total) / count, len(batches)

    def validation_loss(self) -> float:
        """Mean loss over the validation samples with the current (EMA) weights."""
        self.model.eval()
        if self._val_batches is None:  # the same batches every epoch: collate them once
            size = self.settings.batch_size
            chunks = [self.val_samples[start : start + size] for start in range(0, len(self.val_samples), size)]
            self._val_batches = [(self.collate(chunk, self.device), len(chunk)) for chunk in chunks]
        frozen = [p for p in self.params if p.requires_grad]
        try:  # no autograd record of the parameters (a loss may still differentiate its inputs, e.g. forces)
            for p in frozen:
                p.requires_grad_(False)
            with self.autocast():
                total = sum(self.loss_fn(self.model, b, False).float().item() * n for b, n in self._val_batches)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return total / len(self.val_samples)

    def autocast(self) -> AbstractContextManager:
        """``torch.autocast`` in the settings' mixed precision, or nothing for float32 / float64."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # -- checkpoints -----------------------------------------------------------------------------
    def _trainable_values(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone().cpu() for name, p in zip(self.names, self.params)}

    def _random_states(self) -> list[dict[str, Any]]:
        """Every process's generator states (`workbench.core.randomness.capture`), in rank order (a collective under
        DDP)."""
        mine = randomness.capture()
        if self.world_size == 1:
            return [mine]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    def _state(self, random_states: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "label": self.label,
            "settings": asdict(self.settings),
            "epoch": len(self.history),
            "stopped": self.stopped,
            "params": self._trainable_values(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "best": self.best,
            "history": self.history,
            "random": random_states,
        }

    def _restore(self, state: dict[str, Any]) -> None:
        written = asdict(TrainSettings(**state["settings"]))  # settings added since it was written: their defaults
        if state["label"] != self.label or written != asdict(self.settings):
            raise ValueError(
                f"{self.checkpoint_path}: checkpoint of '{state['label']}' with settings "
                f"{written} does not match '{self.label}' with {asdict(self.settings)}"
            )
        with torch.no_grad():
            for name, p in zip(self.names, self.params):
                p.copy_(state["params"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.best, self.history, self.stopped = state["best"], state["history"], state["stopped"]
        if "objective" not in self.best:  # written before selection on a metric existed: the loss chose
            self.best["objective"] = self.best.pop("val_loss")
        if "random" in state and len(state["random"]) == self.world_size:
            randomness.restore(state["random"][self.rank])
        else:
            log.warning("%s: the checkpoint holds no random-number state for %d process(es); the resumed run draws "
                        "other random numbers than the uninterrupted one would", self.checkpoint_path, self.world_size)

    # -- the loop --------------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> list[dict[str, float]]:
        """Train until ``epochs`` or early stopping; returns the per-epoch history.

        With ``resume`` and an existing checkpoint, training continues where that checkpoint ends.
        """
        try:
            return self._fit(resume)
        finally:
            self._release_frozen()
            self.model.eval()

    def _say_duration(self, first_epoch_s: float) -> None:
        """After the first epoch: how long the remaining epochs will take at its pace [s], when that is more than
        `ESTIMATE_ABOVE_S` (a long run says so before it is under way; early stopping can end it sooner)."""
        remaining = first_epoch_s * (self.settings.epochs - 1)
        if remaining > ESTIMATE_ABOVE_S:
            log.info("%s: the first epoch took %.1f s; at that pace the other %d take about %s (early stopping may "
                     "end sooner)", self.label, first_epoch_s, self.settings.epochs - 1, _duration(remaining))

    def _fit(self, resume: bool) -> list[dict[str, float]]:
        if resume and self.checkpoint_path is not None and self.checkpoint_path.is_file():
            self._restore(load_checkpoint(self.checkpoint_path))
            log.info("%s: resumed after epoch %d", self.label, len(self.history))
        bar = tqdm(
            total=self.settings.epochs,
            initial=len(self.history),
            desc=self.label,
            disable=not self.progress,
            leave=False,
            unit="epoch",
        )
        while len(self.history) < self.settings.epochs and not self.stopped:
            epoch = len(self.history)
            if self.epoch_start is not None:
                self.epoch_start(epoch, self.settings.epochs)
            threads = self.threads()
            start = time.perf_counter()
            train_loss, steps = self._train_epoch(epoch)
            seconds = time.perf_counter() - start
            with self._averaged():
                val_loss = self.validation_loss()
                objective = val_loss if self.settings.select_on == "loss" else float(self.score(self.model))
                selectable = epoch >= self.settings.select_from
                if selectable and objective < self.best["objective"]:
                    self.best = {"objective": objective, "epoch": epoch, "state": self._trainable_values()}
                curves = {} if self.track is None else {"curves": self.track(self.model)}
            if selectable and self.settings.schedule == "plateau":
                self.scheduler.step(objective)
            self.history.append(
                {
                    "epoch": epoch,
                    "train_loss": train_loss,
                    "val_loss": val_loss,
                    "objective": objective,
                    "lr": self.optimizer.param_groups[0]["lr"],
                    **self._group_rates(),
                    "seconds": seconds,
                    "steps": steps,
                    "selectable": selectable,
                    "threads": threads,
                    **curves,
                }
            )
            self.stopped = epoch - max(self.best["epoch"], self.settings.select_from - 1) >= self.settings.patience
            if self.checkpoint_path is not None:
                random_states = self._random_states()  # every process takes part
                if self.rank == 0:
                    save_checkpoint(self.checkpoint_path, self._state(random_states))
            if len(self.history) == 1 and self.rank == 0:
                self._say_duration(time.perf_counter() - start)
            bar.update(1)
            bar.set_postfix(train=f"{train_loss:.4g}", val=f"{val_loss:.4g}")
            log.debug("%s epoch %d: train %.5g val %.5g (%.2fs)", self.label, epoch + 1, train_loss, val_loss, seconds)
        bar.close()
        if self.stopped:
            best = self.best["epoch"] + 1
            log.info("%s: early stop after epoch %d (best %d; from 1)", self.label, len(self.history), best)
        if self.best["state"] is not None:
            with torch.no_grad():
                for name, p in zip(self.names, self.params):
                    p.copy_(self.best["state"][name])
        return self.history

    def _averaged(self):
        return nullcontext() if self.ema is None else self.ema.average_parameters()
