"""Several seeds of one model trained side by side as one batched computation (``torch.func.vmap``).

A seed study trains the same architecture K times, each replica from its own initialisation on its own samples.
`SeedBatchTrainer` does what K runs of `workbench.trainer.Trainer` do, in one process: the K replicas' trainable
parameters are stacked along a new leading axis (the replica axis), and every optimizer step runs ONE forward and
ONE backward pass for all of them (``torch.func.functional_call`` on the first model, vectorised by
``torch.vmap``), then one batched gradient clipping, Adam step and EMA update.

Per replica, as `Trainer` (world size 1) does it:

- epoch ``e`` visits the replica's samples in the order of its own seed (``TrainSettings.seed``), batches of
  ``batch_size`` with the short last batch kept;
- Adam/AMSGrad with its own moments and step count: torch's own fused kernel (``torch.optim.adam.adam(fused=True)``,
  what ``torch.optim.Adam(fused=True)`` calls) on the replica's slice of the stacked tensors, so that an update is
  bit for bit the Trainer's given the same gradient (an elementwise re-implementation of the formula is not: the
  compiled kernel fuses multiply-adds; over 30 steps it drifted to 1e-15 relative in float64 and 1e-5 in float32);
- gradient clipping by the replica's own global norm (``clip_grad_norm``), EMA of its weights, its learning-rate
  schedule ("plateau" on its own validation loss, or "linear"), early stopping with ``patience`` and
  ``select_from``, its best epoch, whose (EMA) weights end in its model.

A replica that stops early leaves the batch: its weights are written to its model and its rows dropped from every
stacked tensor, so it stops changing and costs nothing while the others go on.

Where the numbers differ from one-at-a-time runs: the batched matrix products of the forward and backward pass round
differently from a single replica's, so weights agree to rounding, not bit for bit (a 10-32-3 network over 12 epochs,
`tests/test_seed_batch.py`: float64 weights 3e-16 relative apart, its recorded losses, float32 as Trainer records
them, identical; float32 losses 1e-7, weights 2e-7). Everything after the gradient (clipping, Adam, EMA, schedules,
selection) is bit-identical given the same gradient.

Refused with `NotBatchable` (a ``ValueError``; the caller trains one seed at a time with `Trainer` instead): replicas
of unequal sample counts or batch shapes, settings that differ in more than ``seed``, mixed precision
(``bf16`` / ``fp16``), models that draw random numbers or keep running statistics in training (dropout with p > 0,
batch norm, instance norm that tracks running stats: their random streams and statistics cannot match one-at-a-time
runs), models of different architectures or sharing parameters, selection on a metric (``select_on``) and
distributed training (DDP). Parameters that do not require grad and buffers stay out of training: shared from the
first model where every replica holds the same values, else stacked per replica like the trained ones.

Example::

    >>> models = [make_model(seed) for seed in (0, 1, 2)]                                        # doctest: +SKIP
    >>> settings = [replace(base, seed=seed) for seed in (0, 1, 2)]                               # doctest: +SKIP
    >>> histories = SeedBatchTrainer(models, loss_fn, collate, trains, vals, settings).fit()      # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, replace
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.func import functional_call
from torch.optim.adam import adam as adam_step

from workbench.device import device_of
from workbench.trainer import SCHEDULES, TrainSettings, distributed

log = logging.getLogger(__name__)

#: ``torch.optim.Adam``'s defaults, which `Trainer` keeps.
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8


class NotBatchable(ValueError):
    """These replicas cannot be trained as one batched computation with the numbers of one-at-a-time runs; train
    them one at a time with `workbench.trainer.Trainer`."""


class _LossOf(nn.Module):
    """``forward(batch, training)`` is ``loss_fn(model, batch, training)``: what ``functional_call`` runs, so that the
    loss sees a replica's parameters however it uses the model (``model.model`` holds it, hence the ``"model."``
    prefix of the parameter names)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any, bool], torch.Tensor]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any, training: bool) -> torch.Tensor:
        return self.loss_fn(self.model, batch, training)


class _LearningRate:
    """One replica's learning rate under the settings' schedule: torch's own scheduler (the one `Trainer` uses) on an
    optimizer that holds nothing but the rate.

    Args:
        settings: the replica's `TrainSettings`.
        steps_per_epoch: optimizer steps in one epoch (the "linear" schedule's length is ``epochs`` × this).
    """

    def __init__(self, settings: TrainSettings, steps_per_epoch: int):
        self.settings = settings
        self._holder = torch.optim.SGD([torch.zeros(0, requires_grad=True)], lr=settings.learning_rate)
        if settings.schedule == "plateau":
            self._scheduler: Any = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self._holder, factor=settings.lr_factor, patience=settings.lr_patience
            )
            return
        total = settings.epochs * steps_per_epoch  # mirrors Trainer._scheduler's "linear" factor
        warmup = int(settings.warmup_share * total)

        def factor(step: int) -> float:
            if step < warmup:
                return step / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        self._scheduler = torch.optim.lr_scheduler.LambdaLR(self._holder, factor)

    @property
    def value(self) -> float:
        return self._holder.param_groups[0]["lr"]

    def after_step(self) -> None:
        """After an optimizer step ("linear" moves on)."""
        if self.settings.schedule == "linear":
            self._holder.step()  # nothing to update; the scheduler expects its optimizer to have stepped
            self._scheduler.step()

    def after_epoch(self, objective: float) -> None:
        """After a selectable epoch's validation ("plateau" looks at the objective)."""
        if self.settings.schedule == "plateau":
            self._scheduler.step(objective)


class SeedBatchTrainer:
    """Fits K replicas of one architecture as one batched computation; leaves each replica's best (EMA) weights in
    its model, as K `workbench.trainer.Trainer` runs would.

    Args:
        models: K models of the same architecture (same parameter and buffer names, shapes and dtypes, same
            ``requires_grad``), each initialised by the caller (e.g. under its own seed); distinct objects.
        loss_fn: ``loss_fn(model, batch, training) -> scalar tensor`` (mean over the batch), as for `Trainer`. It
            runs once per step for all replicas under ``torch.vmap`` on the first model with the replicas'
            parameters swapped in: it must use ``model`` (not the replica objects) and draw no random numbers.
        collate: ``collate(samples, device) -> batch``, as for `Trainer`; each replica's batch is collated on its
            own, then the tensors of the K batches are stacked (same shapes required).
        train_samples, val_samples: K sequences of samples; every replica holds as many training samples as the
            others, and as many validation samples.
        settings: K `TrainSettings` that differ only in ``seed``; precision "float32" or "float64" (the models'
            own dtype), ``select_on="loss"``.
        device: where batches go (default: where the models are, `workbench.device.device_of`).
        label: names the replicas in messages and the log (``label[k]``).
        threads: ``threads() -> count`` before each epoch, as for `Trainer` (its count is in the history).

    Raises:
        NotBatchable: what cannot be batched with the numbers of one-at-a-time runs (the module docstring's list).

    Shapes:
        stacked trained parameter ``name``: ``(active replicas, *model parameter shape)``; a batch tensor:
        ``(active replicas, *collated shape)``; the vmapped loss: ``(active replicas,)``.
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        loss_fn: Callable[[nn.Module, Any, bool], torch.Tensor],
        collate: Callable[[Sequence[Any], torch.device], Any],
        train_samples: Sequence[Sequence[Any]],
        val_samples: Sequence[Sequence[Any]],
        settings: Sequence[TrainSettings],
        device: torch.device | str | None = None,
        label: str = "seeds",
        threads: Callable[[], int] | None = None,
    ):
        self.models = list(models)
        self.collate = collate
        self.train_samples = [list(samples) for samples in train_samples]
        self.val_samples = [list(samples) for samples in val_samples]
        self.settings = list(settings)
        self.device = device_of(self.models[0]) if device is None else torch.device(device)
        self.label = label
        self.threads = threads or torch.get_num_threads
        self._check()
        first = self.models[0]
        self.names = [name for name, p in first.named_parameters() if p.requires_grad]
        self.params = [[p for p in model.parameters() if p.requires_grad] for model in self.models]
        self.stacked = self._stack_replicas()  # kind -> name -> (active replicas, ...)
        self.fixed = self._fixed_tensors()  # frozen parameters and buffers that differ between replicas
        self._template = _LossOf(first, loss_fn)
        common = self.settings[0]
        self.ema_decay = common.ema_decay
        self._ema_updates = 0
        self._fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in self.params[0]) or None
        self.steps_per_epoch = -(-len(self.train_samples[0]) // common.batch_size)
        self.rates = [_LearningRate(s, self.steps_per_epoch) for s in self.settings]
        self.active = list(range(len(self.models)))  # replica of each row of the stacked tensors
        self.histories: list[list[dict[str, Any]]] = [[] for _ in self.models]
        self.best: list[dict[str, Any]] = [{"objective": float("inf"), "epoch": -1, "state": None} for _ in self.models]
        self.stopped = [False] * len(self.models)
        #: Per replica, the optimizer steps whose gradient clipping scaled down.
        self.clipped_steps = [0] * len(self.models)
        self._val_batches: list[tuple[Any, Any, int]] | None = None

    # -- what can be batched -----------------------------------------------------------------------
    def _check(self) -> None:
        """Refuse (`NotBatchable`) what cannot be batched with one-at-a-time numbers; ValueError for bad input."""
        label, models, settings = self.label, self.models, self.settings
        count = len(models)
        if count == 0:
            raise ValueError(f"{label}: no models to train")
        sizes = {len(self.train_samples), len(self.val_samples), len(settings)}
        if sizes != {count}:
            raise ValueError(
                f"{label}: {count} models need as many training sample lists, validation sample lists and settings, "
                f"got {len(self.train_samples)}, {len(self.val_samples)} and {len(settings)}"
            )
        if distributed()[1] > 1 or any(
            isinstance(m, (nn.DataParallel, nn.parallel.DistributedDataParallel)) for m in models
        ):
            raise NotBatchable(f"{label}: distributed (DDP) training cannot be batched over seeds; use Trainer")
        base = replace(settings[0], seed=0)
        for k, s in enumerate(settings[1:], 1):
            if replace(s, seed=0) != base:
                differ = sorted(key for key, value in asdict(s).items() if key != "seed" and value != asdict(base)[key])
                raise NotBatchable(
                    f"{label}: replica {k}'s settings differ from replica 0's in {differ}, not only in "
                    "seed; batching needs one setting for all"
                )
        if base.precision not in ("float32", "float64"):
            raise NotBatchable(
                f"{label}: precision {base.precision!r} trains under autocast (and fp16 with loss scaling), whose "
                "batched rounding cannot match one-at-a-time runs; batching needs precision float32 or float64"
            )
        if base.schedule not in SCHEDULES:
            raise ValueError(f"{label}: schedule must be one of {', '.join(SCHEDULES)}, got {base.schedule!r}")
        if not 0 <= base.warmup_share < 1:
            raise ValueError(f"{label}: warmup_share must be in [0, 1), got {base.warmup_share}")
        if base.select_on != "loss":
            raise NotBatchable(
                f"{label}: select_on={base.select_on!r} needs a score function per replica; batching "
                "selects on the validation loss only (select_on='loss')"
            )
        for kind, lists in (("training", self.train_samples), ("validation", self.val_samples)):
            lengths = [len(samples) for samples in lists]
            if len(set(lengths)) > 1:
                raise NotBatchable(
                    f"{label}: batching needs equal sizes; the replicas hold {lengths} {kind} samples "
                    "(train them one seed at a time)"
                )
        if len(self.train_samples[0]) < base.batch_size:
            raise ValueError(
                f"{label}: {len(self.train_samples[0])} training samples cannot fill one batch of {base.batch_size}"
            )
        if not self.val_samples[0]:
            raise ValueError(f"{label}: no validation samples")
        if len({id(m) for m in models}) < count:
            raise ValueError(f"{label}: the same model object appears twice; each replica needs its own model")
        tensors = [id(t) for m in models for t in (*m.parameters(), *m.buffers())]
        if len(set(tensors)) < len(tensors):
            raise NotBatchable(f"{label}: the replicas share parameters or buffers; each needs its own")
        for module in (m for model in models for m in model.modules()):
            if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
                raise NotBatchable(
                    f"{label}: the model holds {type(module).__name__}(p={module.p}), whose random masks in training "
                    "cannot match one-at-a-time runs; batching needs p = 0 (or train one seed at a time)"
                )
            if isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
                raise NotBatchable(
                    f"{label}: the model holds MultiheadAttention(dropout={module.dropout}); batching needs dropout 0"
                )
            instance_norm = isinstance(module, nn.modules.instancenorm._InstanceNorm)
            if isinstance(module, nn.modules.batchnorm._BatchNorm) or (instance_norm and module.track_running_stats):
                raise NotBatchable(
                    f"{label}: the model holds {type(module).__name__}, whose training-mode statistics and running "
                    "averages cannot be batched over replicas (train one seed at a time)"
                )
        signature = _architecture(models[0])
        for k, model in enumerate(models[1:], 1):
            if _architecture(model) != signature:
                raise NotBatchable(
                    f"{label}: replica {k}'s model differs from replica 0's (modules, parameter or "
                    "buffer names, shapes, dtypes, devices or requires_grad); batching needs one "
                    "architecture"
                )
        if not any(p.requires_grad for p in models[0].parameters()):
            raise ValueError(f"{label}: the model has no trainable parameters")

    # -- stacked state ------------------------------------------------------------------------------
    def _stack_replicas(self) -> dict[str, dict[str, torch.Tensor]]:
        """The trained parameters of every replica stacked, with their Adam moments, step counts and EMA shadows."""
        with torch.no_grad():
            params = {name: torch.stack([p.detach() for p in ps]) for name, ps in zip(self.names, zip(*self.params))}
        stacked = {"param": params}
        kinds = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if self.settings[0].amsgrad else [])
        for kind in kinds:
            stacked[kind] = {name: torch.zeros_like(t) for name, t in params.items()}
        # torch.optim.Adam(fused=True) counts steps in a float32 scalar per parameter (here one per replica)
        stacked["step"] = {
            name: torch.zeros(len(t), dtype=torch.float32, device=t.device) for name, t in params.items()
        }
        if self.settings[0].ema_decay:
            stacked["shadow"] = {name: t.clone() for name, t in params.items()}
        return stacked

    def _fixed_tensors(self) -> dict[str, torch.Tensor]:
        """Frozen parameters and buffers (keyed ``"model.<name>"``) that differ between replicas, stacked; those every
        replica holds the same stay in the first model, shared."""
        fixed = {}
        named = [
            {**{n: p for n, p in m.named_parameters() if not p.requires_grad}, **dict(m.named_buffers())}
            for m in self.models
        ]
        for name, first in named[0].items():
            values = [tensors[name].detach() for tensors in named]
            if not all(torch.equal(first, value) for value in values[1:]):
                fixed[f"model.{name}"] = torch.stack(values)
        return fixed

    def _keep(self, rows: list[int]) -> None:
        """Only these rows of every stacked tensor (the replicas that go on)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.stacked["param"][self.names[0]].device)
        for tensors in self.stacked.values():
            for name, t in tensors.items():
                tensors[name] = t.index_select(0, index.to(t.device))
        self.fixed = {name: t.index_select(0, index.to(t.device)) for name, t in self.fixed.items()}
        if self._val_batches is not None:
            self._val_batches = [(_select(batch, rows), dims, n) for batch, dims, n in self._val_batches]
        self.active = [self.active[row] for row in rows]

    # -- one step -----------------------------------------------------------------------------------
    def _losses(self, weights: dict[str, torch.Tensor], batch: Any, dims: Any, training: bool) -> torch.Tensor:
        """Every active replica's loss on its part of ``batch`` (one vmapped call): shape (active replicas,)."""

        def loss(weights, fixed, batch):
            tensors = {f"model.{name}": t for name, t in weights.items()} | fixed
            return functional_call(self._template, tensors, (batch, training))

        try:
            losses = torch.vmap(loss, in_dims=(0, 0, dims))(weights, self.fixed, batch)
        except RuntimeError as error:
            if "random" not in str(error):
                raise
            raise NotBatchable(
                f"{self.label}: the loss draws random numbers (dropout or sampling in the forward), "
                "which cannot match one-at-a-time runs; train one seed at a time"
            ) from error
        if losses.shape != (len(self.active),):
            raise ValueError(f"{self.label}: loss_fn must return a scalar, got shape {tuple(losses.shape[1:])}")
        return losses

    def _step(self, batch: Any, dims: Any) -> list[float]:
        """One optimizer step of every active replica; their training losses (as float32, as Trainer records)."""
        leaves = {name: t.detach().requires_grad_() for name, t in self.stacked["param"].items()}
        losses = self._losses(leaves, batch, dims, True)
        # the replicas' losses depend on their own rows only: the sum's gradient is each replica's own
        grads = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
        self._update({name: g for name, g in zip(self.names, grads) if g is not None})
        return losses.detach().float().tolist()

    @torch.no_grad()
    def _update(self, grads: dict[str, torch.Tensor]) -> None:
        """Clipping, Adam, schedules and EMA of every active replica, given its gradients (stacked like the
        parameters, clipped in place; a trained parameter without one, unused by the loss, is skipped by clipping and
        Adam, as in Trainer)."""
        # the batched backward may return transposed strides, and the fused Adam kernel reads a gradient as
        # contiguous memory
        grads = {name: g.contiguous() for name, g in grads.items()}
        clip = self.settings[0].clip_grad_norm
        if clip is not None:  # torch.nn.utils.clip_grad_norm_, per replica (row)
            norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1)
            coefficient = torch.clamp(clip / (torch.linalg.vector_norm(norms, dim=1) + 1e-6), max=1.0)
            for g in grads.values():
                g.mul_(coefficient.view(-1, *[1] * (g.dim() - 1)))
            for replica, clipped in zip(self.active, (coefficient < 1).tolist()):
                self.clipped_steps[replica] += clipped
        self._adam(grads)
        for replica in self.active:
            self.rates[replica].after_step()
        if "shadow" in self.stacked:  # workbench.ema.ExponentialMovingAverage.update, per replica (row)
            self._ema_updates += 1  # every active replica has taken the same number of steps
            decay = min(self.ema_decay, (1 + self._ema_updates) / (10 + self._ema_updates))
            for name, shadow in self.stacked["shadow"].items():
                shadow.sub_((shadow - self.stacked["param"][name]).mul_(1.0 - decay))

    def _adam(self, grads: dict[str, torch.Tensor]) -> None:
        """torch.optim.Adam(fused=True)'s step on each replica's slice, one call per learning rate."""
        settings, stacked = self.settings[0], self.stacked
        rows_at: dict[float, list[int]] = defaultdict(list)
        for row, replica in enumerate(self.active):
            rows_at[self.rates[replica].value].append(row)
        for lr, rows in rows_at.items():

            def slices(kind: str) -> list[torch.Tensor]:
                source = grads if kind == "grad" else stacked[kind]
                replicas = {name: source[name].unbind(0) for name in grads}  # views: the kernel updates them in place
                return [replicas[name][row] for row in rows for name in grads]

            adam_step(
                slices("param"),
                slices("grad"),
                slices("exp_avg"),
                slices("exp_avg_sq"),
                slices("max_exp_avg_sq") if settings.amsgrad else [],
                slices("step"),
                fused=self._fused,
                amsgrad=settings.amsgrad,
                beta1=ADAM_BETAS[0],
                beta2=ADAM_BETAS[1],
                lr=lr,
                weight_decay=settings.weight_decay,
                eps=ADAM_EPS,
                maximize=False,
            )

    # -- one epoch ----------------------------------------------------------------------------------
    def _epoch_order(self, replica: int, epoch: int) -> list[int]:
        # mirrors Trainer._epoch_batches (one process): epoch e of seed s shuffles with the generator (s, e)
        generator = torch.Generator().manual_seed(self.settings[replica].seed * 1_000_003 + epoch)
        return torch.randperm(len(self.train_samples[replica]), generator=generator).tolist()

    def _train_epoch(self, epoch: int) -> list[float]:
        """Every active replica's mean training loss over epoch ``epoch``."""
        self._template.model.train()
        orders = [self._epoch_order(replica, epoch) for replica in self.active]
        size, n = self.settings[0].batch_size, len(self.train_samples[0])
        totals, count = [0.0] * len(self.active), 0
        for start in range(0, n, size):
            parts = [
                [self.train_samples[replica][i] for i in order[start : start + size]]
                for replica, order in zip(self.active, orders)
            ]
            batch, dims = self._stacked_batch(parts)
            losses = self._step(batch, dims)
            totals = [total + loss * len(parts[0]) for total, loss in zip(totals, losses)]
            count += len(parts[0])
        return [total / count for total in totals]

    def _stacked_batch(self, parts: list[list[Any]]) -> tuple[Any, Any]:
        """(batch, vmap in_dims): each replica's samples collated, their tensors stacked on a new axis 0; other
        values, equal in every replica, passed as they are."""
        batches = [self.collate(samples, self.device) for samples in parts]
        flat = [pytree.tree_flatten(batch) for batch in batches]
        spec = flat[0][1]
        if any(s != spec for _, s in flat[1:]):
            raise NotBatchable(f"{self.label}: collate returns batches of different structure for different replicas")
        leaves, dims = [], []
        for values in zip(*(leaves for leaves, _ in flat)):
            if all(isinstance(v, torch.Tensor) for v in values):
                if len({v.shape for v in values}) > 1:
                    shapes = [tuple(v.shape) for v in values]
                    raise NotBatchable(
                        f"{self.label}: batching needs equal batch shapes; collate gave {shapes} "
                        "(train them one seed at a time)"
                    )
                leaves.append(torch.stack(values))
                dims.append(0)
            elif any(isinstance(v, torch.Tensor) for v in values) or any(v != values[0] for v in values[1:]):
                raise NotBatchable(
                    f"{self.label}: collate returns a non-tensor value that differs between replicas "
                    f"({values[0]!r} ...); batching can only stack tensors"
                )
            else:
                leaves.append(values[0])
                dims.append(None)
        return pytree.tree_unflatten(leaves, spec), pytree.tree_unflatten(dims, spec)

    def validation_losses(self) -> list[float]:
        """Every active replica's mean validation loss with its current (EMA) weights, as `Trainer.validation_loss`."""
        self._template.model.eval()
        if self._val_batches is None:  # the same batches every epoch: collate them once
            size, n = self.settings[0].batch_size, len(self.val_samples[0])
            self._val_batches = []
            for start in range(0, n, size):
                parts = [self.val_samples[replica][start : start + size] for replica in self.active]
                self._val_batches.append((*self._stacked_batch(parts), len(parts[0])))
        weights = self.stacked.get("shadow", self.stacked["param"])
        totals = [0] * len(self.active)
        for batch, dims, n in self._val_batches:
            losses = self._losses(weights, batch, dims, False).detach().float().tolist()
            totals = [total + loss * n for total, loss in zip(totals, losses)]
        return [total / len(self.val_samples[0]) for total in totals]

    # -- the loop -----------------------------------------------------------------------------------
    def fit(self) -> list[list[dict[str, Any]]]:
        """Train every replica until ``epochs`` or its early stop; returns each replica's per-epoch history (the
        keys of `Trainer.fit`'s; ``seconds`` is the batched epoch's time, the same for every replica in it)."""
        try:
            self._fit()
        finally:
            for model in self.models:
                model.eval()
        return self.histories

    def _fit(self) -> None:
        settings = self.settings[0]
        epoch = 0
        while self.active and epoch < settings.epochs:
            threads = self.threads()
            start = time.perf_counter()
            train_losses = self._train_epoch(epoch)
            seconds = time.perf_counter() - start
            val_losses = self.validation_losses()
            weights = self.stacked.get("shadow", self.stacked["param"])
            selectable = epoch >= settings.select_from
            for row, replica in enumerate(self.active):
                objective = val_losses[row]
                if selectable and objective < self.best[replica]["objective"]:
                    state = {name: weights[name][row].detach().clone() for name in self.names}
                    self.best[replica] = {"objective": objective, "epoch": epoch, "state": state}
                if selectable:
                    self.rates[replica].after_epoch(objective)
                self.histories[replica].append(
                    {
                        "epoch": epoch,
                        "train_loss": train_losses[row],
                        "val_loss": objective,
                        "objective": objective,
                        "lr": self.rates[replica].value,
                        "seconds": seconds,
                        "steps": self.steps_per_epoch,
                        "selectable": selectable,
                        "threads": threads,
                    }
                )
                since = epoch - max(self.best[replica]["epoch"], settings.select_from - 1)
                self.stopped[replica] = since >= settings.patience
            epoch += 1
            going_on = [row for row, replica in enumerate(self.active) if not self.stopped[replica]]
            if epoch == settings.epochs:
                going_on = []
            for row, replica in enumerate(self.active):
                if row not in going_on:
                    self._finish(row, replica)
            if len(going_on) < len(self.active):
                self._keep(going_on)

    def _finish(self, row: int, replica: int) -> None:
        """Replica ``replica`` (row ``row``) is done: its best (EMA) weights, else its last ones, into its model."""
        if self.stopped[replica]:
            log.info(
                "%s[%d]: early stop after epoch %d (best %d; from 1)",
                self.label,
                replica,
                len(self.histories[replica]),
                self.best[replica]["epoch"] + 1,
            )
        state = self.best[replica]["state"]
        with torch.no_grad():
            for name, p in zip(self.names, self.params[replica]):
                p.copy_(state[name] if state is not None else self.stacked["param"][name][row])


def _architecture(model: nn.Module) -> list[tuple]:
    """What must match between replicas: module types, and every parameter's and buffer's name, shape, dtype,
    device and requires_grad."""
    modules = [(name, type(m)) for name, m in model.named_modules()]
    params = [(n, p.shape, p.dtype, p.device, p.requires_grad) for n, p in model.named_parameters()]
    buffers = [(n, b.shape, b.dtype, b.device) for n, b in model.named_buffers()]
    return [modules, params, buffers]


def _select(batch: Any, rows: list[int]) -> Any:
    """The rows ``rows`` of a stacked batch (its tensors; other values are the same for every replica)."""
    leaves, spec = pytree.tree_flatten(batch)
    kept = [
        leaf.index_select(0, torch.tensor(rows, dtype=torch.long, device=leaf.device))
        if isinstance(leaf, torch.Tensor)
        else leaf
        for leaf in leaves
    ]
    return pytree.tree_unflatten(kept, spec)


def fit_side_by_side(trainers: Sequence[Any]) -> list[list[dict[str, Any]]]:
    """Fit ready `workbench.trainer.Trainer` objects (the seeds of one method and fold, `workbench.lockstep`) as one
    `SeedBatchTrainer`; each one's history, its model left with the weights its own ``fit`` would leave. Their
    losses must read only the model and the batch (`workbench.method.Stage.batchable`): the batched step runs the
    first trainer's loss for every replica.

    Raises:
        NotBatchable: what `SeedBatchTrainer` refuses; a trainer with a hook it has no equal of (``epoch_start``,
            ``gradients``, ``before_step``, ``score``, ``frozen`` modules, several learning rates) or a checkpoint
            to resume from.
    """
    for trainer in trainers:
        hooks = [name for name in ("epoch_start", "gradients", "before_step", "score") if getattr(trainer, name)]
        hooks += ["frozen"] * bool(trainer.frozen) + ["learning_rates"] * (len(trainer.optimizer.param_groups) > 1)
        if hooks:
            raise NotBatchable(f"the training stage uses {', '.join(hooks)}, which batched training does not have")
        if trainer.checkpoint_path is not None and trainer.checkpoint_path.is_file():
            raise NotBatchable("a cell resumes from its checkpoint")
    first = trainers[0]
    with warnings.catch_warnings():  # an operator vmap runs in a loop is slower, not wrong: no user needs to hear it
        warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented")
        return SeedBatchTrainer(
            [t.model for t in trainers], first.loss_fn, first.collate, [t.train_samples for t in trainers],
            [t.val_samples for t in trainers], [t.settings for t in trainers], device=first.device,
            label=first.label, threads=first.threads,
        ).fit()  # fmt: skip
