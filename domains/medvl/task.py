"""The ``medvl`` task: one vision-language model that answers questions about medical images and makes images.

The situation it models (GitHub issue 13): a clinical imaging group adapts a pretrained vision-language model to
comprehension (closed and open VQA, a findings report) and generation (reconstruction, 2× super-resolution, CT→MR
modality conversion) at once, without the two skills competing for one adapter. The default method is H-LoRA
(``hlora``, `workbench.adaptation.hlora`: two plug-ins of token-routed experts, three training stages, each
``--epochs`` long), run beside plain-LoRA plug-ins of the same rank (``--baselines`` for more: ``moelora``,
``hlora-mixed``, ``full``; the default run takes ~4.5 min on 2 CPU cores, MoELoRA alone adds ~3.5).

Data (`workbench.domains.medvl.readers`; images through MONAI, `workbench.domains.medvl.images`):

- default: the embedded synthetic CT/MR-like slices with recorded findings and templated VQA / reports (card
  ``medvl-synthetic``), its ``train.json`` / ``test.json``;
- ``--data FOLDER`` or ``--data FILE.json``: the LLaVA conversation layout (VL-Health, LLaVA-Med; card
  ``llava-conversations``), VQA-RAD (the OSF release or MEVF's ``trainset.json`` / ``testset.json``), SLAKE
  (``--language en|zh|all``, English by default) or PathVQA's JSON (cards ``vqa-rad``, ``slake``, ``pathvqa``), told
  apart by their records' keys; pickles are refused, never loaded.

Reading opens every image a run would read (`workbench.domains.medvl.images.load_image`, at the shipped model's
size; the tensors are kept for the run). A bad record — a missing field, a missing, unreadable, too small or too
large image (``--max-image-pixels``, 64 MP by default, told by the header before decoding) — is skipped into
``task.skipped`` (``--on-bad-record skip``, the default) or stops the run before its directory appears (``raise``).
A record naming an image outside the data folder stops the run, whatever the policy (``--allow-paths-outside``).

Data without some sub-tasks (VQA-RAD, SLAKE and PathVQA hold question answering only): the metrics, tables and
figures are those of the sub-tasks present (``task.metrics`` follows the test split), the model is set to serve
only the kinds present (`workbench.models.medvl.MedVL.kinds`: H-LoRA attaches the comprehension plug-in alone and
aligns on what the data hold), and one warning says which sub-tasks are absent and what was left out.

Groups: a record's group is its subject (the record's ``subject``; VQA-RAD, PathVQA: the image; SLAKE: the image's
folder; else its image), merged with every other group that shares an image with it, as input or as generation
target (`_grouped`). So one patient's slices, an image with all its questions, its report and every generation
record that reads or makes it are one group. The validation records (``--val-share`` of the training groups, for
early stopping) are drawn by group, so they share no image with the training records. Grouped folds (``workbench
compare``, `MedVLTask.hold_out`) hold out whole groups: the records of every split of the data (``train.json`` and
``test.json``, or VQA-RAD's ``phrase_type`` split, whose test questions ask about training images) are pooled and
re-split by group, so no image is in two splits.

Loss: next-token cross-entropy on the answer tokens (`workbench.models.medvl.MedVL`); a batch holding both kinds is
scored kind by kind (each through its own projector and plug-in) and averaged by sample share.

Metrics (test records, higher is better): ``closed_accuracy`` (exact yes / no), ``open_recall`` (share of the
reference answer's words in the model's answer, LLaVA-Med's open-set recall), ``report_f1`` (micro F1 of the
findings parsed out of the reports, `workbench.domains.medvl.generate.report_findings`), and per generation
sub-task ``ssim_*`` / ``psnr_db_*`` of the decoded image against the target (data range 1), ``ssim`` / ``psnr_db``
their means; ``ssim_vq_ceiling`` is the SSIM of the targets passed through the VQ tokenizer alone (the best any
token sequence can do). Sub-tasks absent from the data are left out of the metrics.

Closed answers (`workbench.domains.medvl.closed`): the run's ``classes`` are the distinct closed answers of its
training split (its task state). `evaluate` ranks them for every closed question whose reference is one of them
(``probabilities`` (n, K), ``truth``, ``probabilities_item``: their places among the items; the model's likelihood
of each answer, normalised over the classes); `workbench.clinical.fit.fit_run` fits the clinical layer on them.
Decoding inside `evaluate` runs with the head's hooks silent, so the head's input features the shift alarm takes are
one row per closed question. ``workbench predict`` / ``serve`` (`MedVLTask.predict_folder`): a folder
with one questions file (`workbench.domains.medvl.readers.read_questions`) and its images, one row per question.

Shapes:
    a sample's ``image`` / ``target`` (1, 64, 64) float32 in [0, 1], ``codes`` (8, 8) int64.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from workbench.domains.medvl.closed import answer_classes, answer_probabilities, head_unobserved
from workbench.domains.medvl.closed import normalised as _norm
from workbench.domains.medvl.generate import COMPREHENSION_TASKS, GENERATION_TASKS, TASK_TYPES, report_findings
from workbench.domains.medvl.images import MAX_IMAGE_PIXELS, MIN_IMAGE_PX, load_image
from workbench.domains.medvl.readers import (
    CODE_TOKEN,
    LANGUAGES,
    VlSample,
    read_folder,
    read_json,
    read_questions,
    split_by_phrase_type,
)
from workbench.models.medvl import KINDS, UNK, MedVLConfig

from workbench.core import resampled_metrics
from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.model import spec_of
from workbench.core.options import Option
from workbench.core.records import BadRecordError, SkipReport
from workbench.core.registry import tasks
from workbench.core.task import Evaluation, Predictions, Task, TaskData, held_out_groups, to_device

log = logging.getLogger(__name__)

EMBEDDED = Path(__file__).resolve().parent / "embedded"
#: What ``--method hlora`` (and its variants) is compared with in the same run.
HLORA_BASELINES = ("hlora-lora",)
#: Each metric and the sub-tasks of the test split that give it.
METRIC_TASKS = {
    "closed_accuracy": ("vqa-closed",),
    "open_recall": ("vqa-open",),
    "report_f1": ("report",),
    "ssim": GENERATION_TASKS,
    "psnr_db": GENERATION_TASKS,
}
#: What each metric is, for the report's note.
METRIC_NOTES = {
    "closed_accuracy": "closed-VQA accuracy",
    "open_recall": "open-answer recall",
    "report_f1": "findings F1 of the reports",
    "ssim": "SSIM / PSNR [dB] of the generated images against their targets (per sub-task in metrics.json, with "
    "ssim_vq_ceiling: the VQ tokenizer's own reconstruction of the targets)",
}


@dataclass
class VlItem:
    """One record ready for the model: input ``image`` (1, S, S), the question, the text answer (comprehension)
    or the target image and its VQ ``codes`` (generation), and the ``group`` (subject or image) it belongs to."""

    index: int
    task: str
    kind: str
    image: torch.Tensor
    question: str
    answer: str
    target: torch.Tensor | None
    codes: torch.Tensor | None
    group: str


@dataclass
class VlBatch:
    """A collated batch: one `workbench.models.medvl.MedVL.encode_batch` dict per kind present, with its share of
    the batch's samples."""

    parts: list[tuple[str, dict[str, Any], float]]
    items: list[VlItem]


@dataclass
class VlData:
    """What `MedVLTask.read` returns: the records of each split ("train", "test", and "val" when a fold chose it,
    `MedVLTask.hold_out`), each record's ``subject`` its group (`_grouped`), and where they came from."""

    splits: dict[str, list[VlSample]]
    source: str
    description: str


def kind_of(task: str) -> str:
    return "comprehension" if task in COMPREHENSION_TASKS else "generation"


@tasks.register
class MedVLTask(Task):
    name = "medvl"
    precisions = ("float32", "bf16", "fp16")  # bf16 / fp16: mixed-precision training steps
    description = "Medical VQA, reports and image generation with one VLM (synthetic CT/MR or LLaVA/VQA-RAD/SLAKE)"
    card = "medvl-synthetic"
    reads = ("llava-conversations", "vqa-rad", "slake", "pathvqa")
    requires = ("transformers", "monai", "PIL")
    extra = "medvl"
    default_model = "medvl"
    default_method = "hlora"
    baselines = ()
    capabilities = frozenset({"predict", "folds"})
    group_kind = "subject or image"
    item_kind = "record"
    metrics = ("closed_accuracy", "open_recall", "report_f1", "ssim", "psnr_db")
    metrics_note = (
        "Scores on the test records, higher is better: closed-VQA accuracy, open-answer recall, findings F1 of the "
        "reports, and SSIM / PSNR [dB] of the generated images against their targets (per sub-task in metrics.json, "
        "with ssim_vq_ceiling: the VQ tokenizer's own reconstruction of the targets)."
    )
    defaults: ClassVar[Mapping[str, Any]] = {
        "epochs": 4,
        "batch_size": 16,
        "train_size": 100_000,
        "val_size": 100_000,
        "patience": 100,
        "ema_decay": 0.0,
    }
    options = (
        Option("val_share", float, 0.1, "share of the training groups (subjects or images) held out for validation"),
        Option("max_answer_words", int, 40, "longest text answer decoded at evaluation [tokens]"),
        Option("language", str, "en", "SLAKE's questions kept, by q_lang: en, zh or all", choices=LANGUAGES),
        Option(
            "max_image_pixels",
            int,
            MAX_IMAGE_PIXELS,
            "most pixels an input image may have (rows x columns [x slices]), read from its header before decoding; "
            "a larger one is a bad record",
        ),
    )
    examples = (
        "workbench adapt --domain medvl                          # H-LoRA (3 stages) beside LoRA plug-ins, ~4.5 min",
        "workbench adapt --domain medvl --baselines moelora,hlora-lora,hlora-mixed,full --epochs 6",
        "workbench adapt --domain medvl --data ~/vqa_rad --method hlora     # VQA-RAD's JSON and image folder",
    )

    def __init__(self, **options: Any):
        super().__init__(**options)
        least = MIN_IMAGE_PX**2
        if self.config["max_image_pixels"] < least:
            raise UserError(
                f"task 'medvl': --max-image-pixels must be at least {least} ({MIN_IMAGE_PX} × {MIN_IMAGE_PX} px, "
                f"the smallest image read), got {self.config['max_image_pixels']}"
            )
        #: Images loaded so far, by (path, side [px]): (1, side, side) float32 in [0, 1].
        self._images: dict[tuple[str, int], torch.Tensor] = {}

    @classmethod
    def profile(cls, method: str) -> dict[str, Any]:
        """H-LoRA and its variants are compared with plain-LoRA plug-ins of the same rank."""
        if method in ("hlora", "moelora", "hlora-lora", "hlora-mixed"):
            return {"baselines": tuple(b for b in HLORA_BASELINES if b != method)}
        return {}

    # -- data and model --------------------------------------------------------------------------
    def read(self, data: str | Path | None, seed: int = 0) -> VlData:
        """The records of each split, every image opened (bad records skipped into ``self.skipped`` or raised)."""
        self.skipped = SkipReport()
        options = {
            "skipped": self.skipped if self.config["on_bad_record"] == "skip" else None,
            "language": self.config["language"],
            "allow_outside": self.config["allow_paths_outside"],
        }
        if data is None:
            raw = VlData(read_folder(EMBEDDED, **options), str(EMBEDDED), "embedded synthetic CT/MR-like slices")
        else:
            path = Path(data)
            if path.is_dir():
                raw = VlData(read_folder(path, **options), str(path), f"vision-language records in {path}")
            elif path.is_file():
                samples = read_json(path, **options)  # a VQA-RAD file says its split; any other file is all train
                splits = split_by_phrase_type(path, samples) if all(s.split for s in samples) else {"train": samples}
                splits.setdefault("test", [])
                raw = VlData(splits, str(path), f"vision-language records of {path}")
            else:
                raise UserError(
                    f"{path}: no such file or folder (give --data a folder with train.json / test.json or a JSON)"
                )
        raw.splits = _grouped({name: self._open_images(part) for name, part in raw.splits.items()})
        return raw

    def default_data(self, seed: int) -> Path:
        """The embedded folder of synthetic slices and their records."""
        return EMBEDDED

    def split_groups(self, raw: VlData) -> list[str]:
        """The groups (subjects or images, `_grouped`) of every split's records, sorted."""
        return sorted({sample.subject for part in raw.splits.values() for sample in part})

    def hold_out(self, raw: VlData, split: Mapping[str, Sequence[str]]) -> VlData:
        """``raw`` re-split by group: the records of every split pooled, those of ``split["test"]`` groups the test
        split, of ``split["val"]`` groups the validation split (none named: `prepare` draws ``--val-share`` of the
        training groups), every other group's records the training split."""
        parts = held_out_groups(self.split_groups(raw), split, raw.source, self.group_kind)
        where = {group: name for name, groups in parts.items() for group in groups}
        pooled = [sample for part in raw.splits.values() for sample in part]
        splits = {name: [s for s in pooled if where[s.subject] == name] for name in parts if parts[name]}
        return dataclasses.replace(raw, splits=splits, description=f"{raw.description}, re-split by held-out groups")

    def _image(self, path: Path, size: int, field: str, source: str) -> torch.Tensor:
        """``path`` loaded at ``size`` (kept: reading opens each image once, the run reuses it)."""
        key = (str(path), size)
        if key not in self._images:
            self._images[key] = load_image(path, channels=1, size=size, field=field, source=source,
                                           max_pixels=self.config["max_image_pixels"])  # fmt: skip
        return self._images[key]

    def _open_images(self, samples: Sequence[VlSample]) -> list[VlSample]:
        """The samples whose images open (at the shipped model's size); the others skipped or raised."""
        size, kept = MedVLConfig().image_size, []
        for sample in samples:
            try:
                for field, path in (("image", sample.image), ("target_image", sample.target_image)):
                    if path is not None:
                        self._image(path, size, field, _where(sample))
            except UserError as error:
                problem = str(error).removeprefix(f"{_where(sample)}: ")
                if self.config["on_bad_record"] == "raise":
                    raise BadRecordError(_where(sample), problem) from None
                self.skipped.add(_where(sample), problem)
                continue
            kept.append(sample)
        return kept

    def _items(self, model: nn.Module, samples: Sequence[VlSample], start: int) -> list[VlItem]:
        size = model.config.image_size
        items = []
        for offset, sample in enumerate(samples):
            image = self._image(sample.image, size, "image", _where(sample))
            target = codes = None
            answer = sample.answer
            if kind_of(sample.task) == "generation":
                if sample.target_image is not None:
                    target = self._image(sample.target_image, size, "target_image", _where(sample))
                    with torch.no_grad():
                        codes = model.vq.encode(target[None].to(device_of(model)))[0].cpu()  # items stay on the host
                else:
                    codes = self._answer_codes(model, sample)
                answer = ""
            items.append(VlItem(start + offset, sample.task, kind_of(sample.task), image, sample.question, answer,
                                target, codes, sample.subject))  # fmt: skip
        return items

    def _answer_codes(self, model: nn.Module, sample: VlSample) -> torch.Tensor:
        """VQ codes written in a generation answer as ``<idx_i>`` tokens (HealthGPT's layout), checked against the
        model's codebook."""
        found = [int(i) for i in CODE_TOKEN.findall(sample.answer)]
        grid, size = model.vq.grid, model.config.vq.codebook_size
        where = f"{_where(sample)}, field 'conversations' (the answer)"
        if not found:
            raise UserError(f"{where}: a {sample.task} record needs a target_image or <idx_i> image tokens")
        beyond = [i for i in found if i >= size]
        if beyond:
            raise UserError(f"{where}: image token <idx_{beyond[0]}> is beyond the codebook (indices 0..{size - 1})")
        if len(found) != grid * grid:
            raise UserError(f"{where}: {len(found)} image tokens, expected {grid * grid} ({grid}×{grid} VQ codes)")
        return torch.tensor(found, dtype=torch.long).view(grid, grid)

    def prepare(self, model: nn.Module, raw: VlData, train_size: int, val_size: int, seed: int):
        spec = spec_of(model)
        if spec is None or spec.family != "medvl":
            raise UserError("task 'medvl' needs a medvl vision-language model (workbench list)")
        self._model = model  # its tokenizer and sizes build the batches (collate)
        kinds = self._serve_kinds(model, raw.splits)
        note = _coverage_note(raw.splits)
        if note:
            log.warning("%s", note)
        rng = np.random.default_rng(seed)
        train = self._items(model, raw.splits["train"], 0)
        test = self._items(model, raw.splits["test"], len(train))
        if not test:
            raise UserError(f"{raw.source}: no test records (a folder needs test.json; a single JSON is all train)")
        if "val" in raw.splits:  # a fold's validation groups (hold_out)
            val = self._items(model, raw.splits["val"], len(train) + len(test))
        else:
            groups = sorted({item.group for item in train})
            n_val = max(1, round(self.config["val_share"] * len(groups)))
            if len(groups) <= n_val:
                raise UserError(
                    f"{raw.source}: {len(groups)} training group(s) cannot give validation and training ones"
                )
            val_groups = set(rng.choice(groups, n_val, replace=False).tolist())
            val = [item for item in train if item.group in val_groups]
            train = [item for item in train if item.group not in val_groups]
        parts = {"train": train, "val": val, "test": test}
        group_counts = {name: len({item.group for item in part}) for name, part in parts.items()}
        val, train = val[:val_size], train[:train_size]
        unknown = sum(model.tokenizer.encode(f"{item.question} {item.answer}").count(UNK) for item in train)
        summary = {
            "data": raw.description,
            "records": {"train": len(train), "val": len(val), "test": len(test)},
            "tasks": {
                name: dict(Counter(item.task for item in part))
                for name, part in (("train", train), ("val", val), ("test", test))
            },  # fmt: skip
            "groups": group_counts,
            "unknown_words_train": int(unknown),
        }
        present = {item.task for item in test}
        self.metrics = tuple(m for m, needs in METRIC_TASKS.items() if present & set(needs))
        notes = [METRIC_NOTES[m] for m in self.metrics if m in METRIC_NOTES]
        self.metrics_note = f"Scores on the test records, higher is better: {'; '.join(notes)}."
        self.classes = answer_classes(item.answer for item in train if item.task == "vqa-closed")
        return TaskData(train, val, test, raw.source, summary), {"kinds": list(kinds), "classes": self.classes}

    @staticmethod
    def _serve_kinds(model: nn.Module, splits: Mapping[str, Sequence[VlSample]]) -> tuple[str, ...]:
        """Set ``model.kinds`` to the kinds of batch the data hold (`KINDS` order); returns them."""
        held = {kind_of(s.task) for part in splits.values() for s in part}
        model.kinds = tuple(kind for kind in KINDS if kind in held)
        return model.kinds

    def restore(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        """The kinds of batch the run's data held (``model.kinds``; runs written before it: both)."""
        model.kinds = tuple(state.get("kinds", KINDS))
        self.classes = list(state.get("classes", []))

    def use_run_state(self, state: Mapping[str, Any]) -> None:
        """The run's closed answer set (``classes``), which `evaluate` ranks on the data a finished run reads
        (``workbench evaluate``, ``workbench calibrate``)."""
        self.classes = list(state.get("classes", []))

    def test_samples(self, model: nn.Module, raw: VlData) -> list[VlItem]:
        self._model = model
        return self._items(model, raw.splits["test"], 0)

    def sample_tasks(self, samples: Sequence[VlItem]) -> list[str]:
        return [item.task for item in samples]

    # -- training and scoring --------------------------------------------------------------------
    def collate(self, samples: Sequence[VlItem], device: torch.device) -> VlBatch:
        parts = []
        for kind in ("comprehension", "generation"):
            chosen = [item for item in samples if item.kind == kind]
            if not chosen:
                continue
            images = to_device(torch.stack([item.image for item in chosen]), device)
            questions = [item.question for item in chosen]
            if kind == "comprehension":
                answers: Any = [item.answer for item in chosen]
            else:
                answers = torch.stack([item.codes for item in chosen])
            inputs = self._model.encode_batch(images, questions, answers, kind=kind)
            parts.append((kind, inputs, len(chosen) / len(samples)))
        return VlBatch(parts, list(samples))

    def loss(self, model: nn.Module, batch: VlBatch, training: bool) -> torch.Tensor:
        return sum(share * model(**inputs).loss for _, inputs, share in batch.parts)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, samples: Sequence[VlItem], device) -> Evaluation:
        from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

        model.eval()
        size = 32
        metrics: dict[str, float] = {}
        predictions: dict[str, np.ndarray] = {}
        comprehension = [item for item in samples if item.kind == "comprehension"]
        answers: list[str] = []
        for start in range(0, len(comprehension), size):
            chunk = comprehension[start : start + size]
            images = torch.stack([item.image for item in chunk]).to(device)
            with head_unobserved(model):  # decoding's head calls are not features (`closed`)
                answers += model.answer(images, [item.question for item in chunk], self.config["max_answer_words"])
        by_task: dict[str, list[tuple[VlItem, str]]] = {}
        for item, answer in zip(comprehension, answers):
            by_task.setdefault(item.task, []).append((item, answer))
        if "vqa-closed" in by_task:
            metrics["closed_accuracy"] = float(np.mean([_norm(a) == _norm(i.answer) for i, a in by_task["vqa-closed"]]))
        if "vqa-open" in by_task:
            metrics["open_recall"] = float(np.mean([_recall(i.answer, a) for i, a in by_task["vqa-open"]]))
        if "report" in by_task:
            metrics["report_f1"] = _findings_f1([(i.answer, a) for i, a in by_task["report"]])
        scores = [_score(item, answer) for item, answer in zip(comprehension, answers)]
        position = {id(item): i for i, item in enumerate(samples)}  # the item order of `rescore`
        predictions["answer_scores"] = np.array(scores, np.float64)  # per record: correct, recall or findings F1
        predictions["answer_task"] = np.array([COMPREHENSION_TASKS.index(i.task) for i in comprehension], np.int64)
        predictions["answer_item"] = np.array([position[id(i)] for i in comprehension], np.int64)
        found = [_findings_counts(i.answer, a) if i.task == "report" else (0, 0, 0)
                 for i, a in zip(comprehension, answers)]  # fmt: skip
        predictions["report_counts"] = np.array(found, np.float64).reshape(-1, 3)  # findings tp, fp, fn per answer
        ssim_all, psnr_all = [], []
        for task in GENERATION_TASKS:
            chosen = [item for item in samples if item.task == task and item.target is not None]
            if not chosen:
                continue
            made, targets, inputs = [], [], []
            for start in range(0, len(chosen), size):
                chunk = chosen[start : start + size]
                images = torch.stack([item.image for item in chunk]).to(device)
                with head_unobserved(model):
                    made.append(model.generate_images(images, [item.question for item in chunk]).float().cpu())
                targets.append(torch.stack([item.target for item in chunk]))
                inputs.append(images.cpu())
            made, target = torch.cat(made).clamp(0, 1), torch.cat(targets)
            each = structural_similarity_index_measure(made, target, data_range=1.0, reduction="none")
            ssim = float(each.mean())
            psnr = float(peak_signal_noise_ratio(made, target, data_range=1.0))
            key = task.replace("-", "_")
            predictions[f"ssim_each_{key}"] = each.double().numpy()  # (n_images,) and their mean squared errors
            predictions[f"mse_each_{key}"] = ((made.double() - target.double()) ** 2).flatten(1).mean(1).numpy()
            predictions[f"item_{key}"] = np.array([position[id(i)] for i in chosen], np.int64)
            metrics[f"ssim_{key}"], metrics[f"psnr_db_{key}"] = ssim, psnr
            ssim_all.append(ssim)
            psnr_all.append(psnr)
            predictions[f"generated_{key}"] = made[:4].numpy()
            predictions[f"target_{key}"] = target[:4].numpy()
            predictions[f"input_{key}"] = torch.cat(inputs)[:4].numpy()
            if task == "reconstruct":
                ceiling = model.vq.decode(model.vq.encode(target.to(device))).float().cpu().clamp(0, 1)
                metrics["ssim_vq_ceiling"] = float(structural_similarity_index_measure(ceiling, target, data_range=1.0))
        if ssim_all:
            metrics["ssim"], metrics["psnr_db"] = float(np.mean(ssim_all)), float(np.mean(psnr_all))
        predictions.update(self._closed_predictions(model, samples, position))  # last: its head calls are the features
        return Evaluation(metrics, predictions, np.array([item.group for item in samples]))

    def _closed_predictions(self, model: nn.Module, samples: Sequence[VlItem],
                            position: Mapping[int, int]) -> dict[str, np.ndarray]:  # fmt: skip
        """The run's answer classes ranked for each closed question whose reference answer is one of them
        (`workbench.domains.medvl.closed`): ``probabilities`` (n, K), ``truth`` (n,) class indices,
        ``probabilities_item`` (n,) their places in ``samples``; nothing when the run has no classes or no such
        question. They are what the clinical layer (`workbench.clinical.fit`) fits."""
        classes = list(getattr(self, "classes", None) or [])
        chosen = [item for item in samples if item.task == "vqa-closed" and _norm(item.answer) in classes]
        if not chosen:
            return {}
        images = torch.stack([item.image for item in chosen])
        probabilities = answer_probabilities(model, images, [item.question for item in chosen], classes)
        return {"probabilities": probabilities,
                "truth": np.array([classes.index(_norm(item.answer)) for item in chosen], np.int64),
                "probabilities_item": np.array([position[id(item)] for item in chosen], np.int64)}  # fmt: skip

    def rescore(self, predictions: Mapping[str, np.ndarray], counts: np.ndarray) -> dict[str, np.ndarray]:
        """`evaluate`'s scores of resampled records: closed accuracy and open recall (means of the records'
        scores), report F1 (micro, from the reports' summed findings counts), SSIM (mean per image) and PSNR (of the
        mean squared error over the images) per generation sub-task and their means; the VQ ceiling is the
        tokenizer's, not the model's."""
        counts = np.asarray(counts, np.float64)
        drawn = counts[:, predictions["answer_item"]]
        metrics: dict[str, np.ndarray] = {}
        for name, task in (("closed_accuracy", "vqa-closed"), ("open_recall", "vqa-open")):
            chosen = predictions["answer_task"] == COMPREHENSION_TASKS.index(task)
            if chosen.any():
                metrics[name] = resampled_metrics.mean(predictions["answer_scores"][chosen], drawn[:, chosen])
        reports = predictions["answer_task"] == COMPREHENSION_TASKS.index("report")
        if reports.any():
            tp, fp, fn = (drawn[:, reports] @ predictions["report_counts"][reports]).T
            with np.errstate(divide="ignore", invalid="ignore"):
                f1 = np.where(tp + fp + fn == 0, 1.0, 2 * tp / (2 * tp + fp + fn))
            metrics["report_f1"] = np.where(drawn[:, reports].sum(axis=1) > 0, f1, np.nan)
        ssim, psnr = [], []
        for task in GENERATION_TASKS:
            key = task.replace("-", "_")
            if f"item_{key}" not in predictions:
                continue
            images = counts[:, predictions[f"item_{key}"]]
            ssim.append(resampled_metrics.mean(predictions[f"ssim_each_{key}"], images))
            with np.errstate(divide="ignore"):
                psnr.append(-10 * np.log10(resampled_metrics.mean(predictions[f"mse_each_{key}"], images)))
            metrics[f"ssim_{key}"], metrics[f"psnr_db_{key}"] = ssim[-1], psnr[-1]
        if ssim:
            metrics["ssim"], metrics["psnr_db"] = (resampled_metrics.macro(np.stack(v, axis=1)) for v in (ssim, psnr))
        return metrics

    def figures(self, evaluations: Mapping[str, Evaluation], out_dir: Path) -> list[tuple[str, str]]:
        from workbench.domains.medvl.plots import generated_images, scores_by_method

        figures = [("Scores of each method on the test records", scores_by_method(evaluations, out_dir))]
        made = generated_images(evaluations, out_dir)
        if made:
            figures.append(("Generated images: input, target and each method's output, per sub-task", made))
        return figures

    # -- batch prediction ------------------------------------------------------------------------
    def predict_folder(self, model: nn.Module, folder: Path, state: Mapping[str, Any]) -> Predictions:
        """Answer every question of the folder's questions file from the run's closed answer set: one row per
        (image, question) with ``record`` (the image, relative to ``folder``), ``question_id``, ``question``,
        ``status``, ``p_<answer>`` per class of the run (`workbench.domains.medvl.closed`) and ``predicted`` (the
        most probable answer); ``facts["classes"]`` the run's answers.

        The folder holds one questions file (``*.json``, `workbench.domains.medvl.readers.read_questions`) and the
        images it names (PNG / JPEG / BMP / TIFF, DICOM, NIfTI; beside it or in ``images/``). An image that cannot be
        read gets ``status`` "error: <why>" on each of its questions and empty scores; the others go on. A questions
        file that is missing, malformed or names an image that does not exist is a `UserError` (file, record, field).
        """
        classes = list(state.get("classes") or [])
        if not classes:
            raise UserError(f"task 'medvl': this run's task state names no closed answers (its data held no closed "
                            f"question, or it was made before batch prediction): {folder} cannot be answered")
        folder = Path(folder)
        files = sorted(p for p in folder.glob("*.json") if p.is_file())
        if len(files) != 1:
            found = ", ".join(p.name for p in files) or "none"
            raise UserError(f"{folder}: expected one questions file (*.json: records with 'image_name' and "
                            f"'question'), found {found}")  # fmt: skip
        samples = read_questions(files[0], data_folder=folder, allow_outside=self.config["allow_paths_outside"])
        size, images, problems = model.config.image_size, {}, {}
        for sample in samples:
            if sample.image in images or sample.image in problems:
                continue
            try:
                images[sample.image] = load_image(sample.image, channels=1, size=size,
                                                  max_pixels=self.config["max_image_pixels"])  # fmt: skip
            except UserError as error:  # one line, without load_image's "field 'image': "
                problems[sample.image] = " ".join(str(error).removeprefix("field 'image': ").split())
        ok = [sample for sample in samples if sample.image in images]
        model.eval()
        probabilities = np.zeros((0, len(classes)))
        if ok:
            stacked = torch.stack([images[s.image] for s in ok])
            probabilities = answer_probabilities(model, stacked, [s.question for s in ok], classes)
        scored = {id(sample): p for sample, p in zip(ok, probabilities)}
        columns = ["record", "question_id", "question", "status"] + [f"p_{c}" for c in classes] + ["predicted"]
        rows = []
        for sample in samples:
            record = sample.image.relative_to(folder.resolve()) if sample.image.is_relative_to(folder.resolve()) \
                else sample.image
            row: dict[str, Any] = {"record": str(record), "question_id": sample.id, "question": sample.question}
            if id(sample) not in scored:
                rows.append({**row, "status": f"error: {problems[sample.image]}"})
                continue
            p = scored[id(sample)]
            row["status"] = "ok"
            row.update({f"p_{c}": f"{p[k]:.6f}" for k, c in enumerate(classes)})
            row["predicted"] = classes[int(np.argmax(p))]
            rows.append(row)
        return Predictions(columns, rows, {"classes": classes, "questions_file": files[0].name})

    # -- data commands ---------------------------------------------------------------------------
    def generate(self, out: Path, seed: int | None = None, **options: Any) -> str:
        from workbench.domains.medvl.generate import generate

        summary = generate(out, seed=0 if seed is None else seed)
        return f"wrote {out}: {summary}"

    def pretrain(self, out: Path, epochs: int = 0, seed: int = 0, device: str = "auto", quiet: bool = False) -> str:
        """The shipped tiny VLM: VQ tokenizer, ViT and language model pretrained apart
        (`workbench.domains.medvl.pretrain`)."""
        from workbench.domains.medvl.pretrain import pretrain

        return pretrain(out, seed=seed, device=device)

    def info(self, data: str | Path | None) -> str:
        """The records of each split by sub-task, after opening every image (`read`)."""
        raw = self.read(data)
        lines = [f"source: {raw.description} ({raw.source})"]
        for name, part in raw.splits.items():
            lines.append(f"{name}: {len(part)} records, {dict(sorted(Counter(s.task for s in part).items()))}")
        lines.append(f"images opened: {len(self._images)}")
        note = _coverage_note(raw.splits)
        return "\n".join(lines + ([note] if note else []))


def _where(sample: VlSample) -> str:
    return sample.source  # "<file> record <i> (<id>)"


def _grouped(splits: Mapping[str, Sequence[VlSample]]) -> dict[str, list[VlSample]]:
    """``splits`` with each record's ``subject`` set to its group: the records' subjects (else their images) joined
    wherever two records share an image (input or target), each group named by its first subject in sorted order."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def root(node: tuple[str, str]) -> tuple[str, str]:
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    def keys(sample: VlSample) -> list[tuple[str, str]]:
        images = [sample.image, *([sample.target_image] if sample.target_image is not None else [])]
        return [("subject", sample.subject or str(sample.image)), *(("image", str(image)) for image in images)]

    samples = [sample for part in splits.values() for sample in part]
    for sample in samples:
        first, *others = keys(sample)
        for other in others:
            a, b = sorted((root(first), root(other)))
            parent[b] = a
    names: dict[tuple[str, str], str] = {}
    for sample in samples:
        subject = keys(sample)[0]
        names[root(subject)] = min(names.get(root(subject), subject[1]), subject[1])
    return {
        name: [dataclasses.replace(s, subject=names[root(keys(s)[0])]) for s in part] for name, part in splits.items()
    }


def _coverage_note(splits: Mapping[str, Sequence[VlSample]]) -> str | None:
    """Which sub-tasks the data lack and what is left out because of it (None when they hold all of them)."""
    held = {s.task for part in splits.values() for s in part}
    absent = [t for t in TASK_TYPES if t not in held]
    if not absent or not held:
        return None
    unscored = [m for m, needs in METRIC_TASKS.items() if not held & set(needs)]
    skipped = [f"the metrics {', '.join(unscored)}"] if unscored else []
    if not held & set(GENERATION_TASKS):
        skipped += [
            "the generated-image figure",
            "the generation side of the model (methods with per-kind plug-ins, such as H-LoRA, train the "
            "comprehension plug-in alone)",
        ]
    if "report" not in held and "reconstruct" not in held:
        skipped.append("H-LoRA's usual alignment data (report, reconstruct): stage 1 aligns on the sub-tasks held")
    return (
        f"medvl: the data hold only {', '.join(t for t in TASK_TYPES if t in held)}; absent: {', '.join(absent)}. "
        f"Left out because of it: {'; '.join(skipped)}."
    )


def _recall(reference: str, answer: str) -> float:
    """Share of the reference's words found in the answer (LLaVA-Med's open-answer recall)."""
    wanted, found = _norm(reference).split(), set(_norm(answer).split())
    return float(np.mean([w in found for w in wanted])) if wanted else float(not found)


def _score(item: VlItem, answer: str) -> float:
    """One comprehension record's score: exact match (closed), word recall (open), findings F1 (report)."""
    if item.task == "vqa-closed":
        return float(_norm(answer) == _norm(item.answer))
    if item.task == "vqa-open":
        return _recall(item.answer, answer)
    return _findings_f1([(item.answer, answer)])


def _findings_counts(reference: str, answer: str) -> tuple[int, int, int]:
    """(true positive, false positive, false negative) findings of a generated report against its reference."""
    truth, made = report_findings(reference), report_findings(answer)
    return len(truth & made), len(made - truth), len(truth - made)


def _findings_f1(pairs: Sequence[tuple[str, str]]) -> float:
    """Micro F1 of the findings parsed from reference and generated reports (1.0 when both name none)."""
    counts = [_findings_counts(reference, answer) for reference, answer in pairs]
    tp, fp, fn = np.array(counts, np.int64).reshape(-1, 3).sum(axis=0)
    return 1.0 if tp + fp + fn == 0 else float(2 * tp / (2 * tp + fp + fn))
