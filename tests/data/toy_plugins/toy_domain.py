"""A toy domain, as a third party would add one: one module, its data card beside it and one entry-point line.
The task: a model fitted to y = w·x must follow the target's y = 2 w·x + 1 (a scale shift)."""

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from workbench.core.registry import tasks
from workbench.core.task import Evaluation, Task, TaskData

WEIGHTS = np.array([1.0, -2.0, 0.5], dtype=np.float32)


@tasks.register
class ToyShift(Task):
    name = "toy-shift"
    description = "toy: a regressor under a scale shift of its target"
    card = str(Path(__file__).with_name("toy_domain.yaml"))
    default_model = "toy-net"
    default_method = "toy-recalibration"
    baselines = ("full",)
    metrics = ("mse",)
    defaults = {"epochs": 30, "batch_size": 16, "train_size": 64, "patience": 30}

    def read(self, data, seed):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(256, 3)).astype(np.float32)
        return {"x": x, "y": (2 * x @ WEIGHTS + 1).astype(np.float32), "source": "generated in memory"}

    def prepare(self, model, raw, train_size, val_size, seed):
        with torch.no_grad():  # the "pretrained" model: fitted to the source relation y = w·x
            model.body.weight.copy_(torch.eye(8, 3))
            model.body.bias.zero_()
            model.head.weight.copy_(torch.cat([torch.as_tensor(WEIGHTS), torch.zeros(5)])[None])
            model.head.bias.zero_()
        samples = list(zip(raw["x"], raw["y"]))
        train, val = samples[:train_size], samples[train_size : train_size + val_size]
        return TaskData(train, val, self.test_samples(model, raw), raw["source"]), {}

    def test_samples(self, model, raw):
        return list(zip(raw["x"], raw["y"]))[-64:]

    def restore(self, model, state):
        self.prepare(model, {"x": np.zeros((0, 3)), "y": np.zeros(0), "source": ""}, 0, 0, 0)

    def collate(self, samples, device):
        x, y = zip(*samples)
        return torch.as_tensor(np.stack(x), device=device), torch.as_tensor(np.array(y), device=device)

    def loss(self, model, batch, training):
        x, y = batch
        return F.mse_loss(model(x)[:, 0], y)

    def evaluate(self, model, samples, device):
        with torch.no_grad():
            x, y = self.collate(samples, device)
            prediction = model.eval()(x)[:, 0]
        predictions = {"prediction": prediction.numpy(), "truth": y.numpy()}
        return Evaluation({"mse": float(F.mse_loss(prediction, y))}, predictions, groups=np.arange(len(samples)))

    def rescore(self, predictions, counts):
        """The mean squared error of each resample of the test items (``counts`` (n_resamples, n_items))."""
        squared = (predictions["prediction"].astype(np.float64) - predictions["truth"]) ** 2
        return {"mse": counts @ squared / counts.sum(axis=1)}
