"""Medical VQA and instruction data as published, read into `VlSample` records (cards ``llava-conversations``,
``vqa-rad``, ``slake``, ``pathvqa``, ``medvl-synthetic``). A file's layout is told by the keys of its records,
never by its name (`detect_layout`):

    =========  ===========================================================  ==========================================
    layout     a record has                                                  images
    =========  ===========================================================  ==========================================
    llava      ``conversations`` (human, gpt, human, gpt, ...), ``image``    relative to the JSON file (or image_root)
               (a path or a list of one); optional ``id``, ``task``,
               ``target_image``, ``subject``, ``findings``
    vqa-rad    ``image_name``, ``question``, ``answer``, ``answer_type``     ``VQA_RAD Image Folder/`` (OSF) or
               (CLOSED / OPEN), ``phrase_type``; ``qid``                     ``images/`` (MEVF's copy) beside the JSON
    slake      ``img_name``, ``question``, ``answer``, ``q_lang``,           ``imgs/`` beside the JSON
               ``answer_type``; ``qid``
    pathvqa    ``image``, ``question``, ``answer`` and neither               ``images/<split>/<image>.jpg`` (split from
               ``conversations`` nor ``answer_type`` (a JSON export of the   the name, e.g. ``train_0422``) or
               published pickles, see the card ``pathvqa``)                  ``<image>`` relative to the JSON
    =========  ===========================================================  ==========================================

Tasks: a LLaVA record's ``task`` must be one of `TASK_TYPES`; without one, an answer "yes" / "no" makes it
``vqa-closed``, anything else ``vqa-open``; the generation tasks need a ``target_image``, or the image as VQ code
tokens ``<idx_i>`` in the answer (HealthGPT's layout; the task checks them against its tokenizer). A LLaVA record
with several question/answer turns gives one sample per turn (ids ``<id>-<turn>``); its human turns must hold
exactly one ``<image>`` token per image of the record. Questions are the human turn without its ``<image>`` tokens and
newlines (spaces collapsed); answers the gpt turn as written. VQA-RAD and SLAKE: ``answer_type`` CLOSED ->
``vqa-closed``, OPEN -> ``vqa-open``; PathVQA: yes/no answers closed, the rest open. Their answers (strings or
numbers) become stripped lower-case strings.

Splits (`read_folder`): ``train.json`` and ``test.json`` of a folder (SLAKE's, an LLaVA export, the synthetic
set), or ``trainset.json`` and ``testset.json`` (VQA-RAD as MEVF and the methods built on it ship it, ``data_RAD/``);
a ``val.json`` / ``validate.json`` / ``validation.json`` is merged into train, since the task draws its own
validation split by subject. A folder (or file) with a single VQA-RAD JSON (the OSF release, ``VQA_RAD Dataset
Public.json``) is split as published: test = ``phrase_type`` "test_freeform" or "test_para", the rest train. SLAKE
keeps the questions in ``language`` (``q_lang`` "en" by default; "zh", or "all"); the others are counted in the
`ReadReport` passed in, and logged. Python pickles (PathVQA's ``qas/*/*.pkl``) are refused, never loaded: loading a
pickle runs whatever code it holds (the card ``pathvqa`` says how to export them to JSON).

Batch prediction reads a questions file instead (`read_questions`): the same records' image and question keys,
answers not needed.

The readers do not load images (the task does, with `workbench.domains.medvl.images.load_image`); they check that
every image file exists and lies inside the data folder (the folder given, or the JSON's folder; links followed,
and every file of a DICOM series folder too): a record naming an image outside it (``../../x.png``, an absolute
path, a link out) stops the read with a `workbench.core.paths.PathOutsideData` naming the file, the record and the
field, unless ``allow_outside`` (``--allow-paths-outside``); PathVQA's images in the folders above its JSON count as
outside. A problem confined to one record (a missing field, an unknown task, a missing image) is a
`workbench.core.records.BadRecordError` naming the file, the record (index and id) and the field: raised, or, when the
caller passes a `workbench.core.records.SkipReport`, added to it and the record left out. A problem with the whole file
(not JSON, no layout fits, nothing usable) is a `UserError`.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from workbench.domains.medvl.generate import GENERATION_TASKS, TASK_TYPES

from workbench.core.errors import UserError
from workbench.core.paths import PathOutsideData, confined
from workbench.core.records import BadRecordError, SkipReport

log = logging.getLogger(__name__)

LAYOUTS = ("llava", "vqa-rad", "slake", "pathvqa")
#: The keys each layout's records must have (`detect_layout` reads the first record's).
LAYOUT_KEYS = {
    "llava": ("conversations", "image"),
    "vqa-rad": ("image_name", "question", "answer", "answer_type", "phrase_type"),
    "slake": ("img_name", "question", "answer", "q_lang", "answer_type"),
    "pathvqa": ("image", "question", "answer"),
}
#: VQA-RAD's test questions (the rest is train).
VQA_RAD_TEST_PHRASES = ("test_freeform", "test_para")
VALIDATION_FILES = ("val.json", "validate.json", "validation.json")
#: The (train, test) file names of a folder: the usual ones, and MEVF's copy of VQA-RAD (``data_RAD/``).
SPLIT_FILES = (("train.json", "test.json"), ("trainset.json", "testset.json"))
#: SLAKE's question languages (``q_lang``), and "all".
LANGUAGES = ("en", "zh", "all")
IMAGE_TOKEN = "<image>"
#: A generated image written as VQ code tokens in the answer (HealthGPT's layout), instead of a target_image.
CODE_TOKEN = re.compile(r"<idx_(\d+)>")
_CLOSED_ANSWERS = ("yes", "no")


@dataclass(frozen=True)
class VlSample:
    """One question (or instruction) about one image.

    ``image`` and ``target_image`` (generation tasks) are absolute paths; ``source`` says where the sample came
    from (``"<file> record <i> (<id>)"``, what `load_image` names in its messages); ``findings`` the record's
    ground truth when it has one (the synthetic set); ``subject`` what the task groups by when it splits (the
    record's ``subject``, else its image); ``split`` the split the file itself assigns (VQA-RAD), else None.
    """

    id: str
    task: str
    image: Path
    question: str
    answer: str
    target_image: Path | None
    source: str
    findings: dict | None = None
    subject: str | None = None
    split: str | None = None


@dataclass
class ReadReport:
    """What the readers read and left out: the layout of each file, and the records dropped, by reason."""

    layouts: dict[str, str] = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        files = ", ".join(f"{Path(f).name}: {layout}" for f, layout in self.layouts.items()) or "no file"
        dropped = ", ".join(f"{n} {reason}" for reason, n in self.dropped.items()) or "nothing dropped"
        return f"{files}; {dropped}"


def detect_layout(records: Sequence[Any], path: str | Path) -> str:
    """The layout of ``records`` (read from ``path``, named in the error when none fits): "llava", "vqa-rad",
    "slake" or "pathvqa", told by the keys of the first record (`LAYOUT_KEYS`; the others are checked as read)."""
    if not isinstance(records, list):
        keys = f" with keys {sorted(records)[:8]}" if isinstance(records, dict) else ""
        found = f"a {type(records).__name__}{keys}"
        raise UserError(f"{path}: expected a JSON list of records, found {found}")
    if not records:
        raise UserError(f"{path}: expected a JSON list of records, found an empty list")
    first = records[0]
    if not isinstance(first, dict):
        raise UserError(f"{path}: record 0: expected a JSON object, found {type(first).__name__}")
    keys = set(first)
    if "conversations" in keys:
        return "llava"
    if {"image_name", "phrase_type"} <= keys:
        return "vqa-rad"
    if {"img_name", "q_lang"} <= keys:
        return "slake"
    if {"image", "question", "answer"} <= keys and "answer_type" not in keys:
        return "pathvqa"
    wanted = "; ".join(f"{name}: {', '.join(k for k in need)}" for name, need in LAYOUT_KEYS.items())
    raise UserError(
        f"{path}: record 0 fits none of the layouts {LAYOUTS} (keys each needs: {wanted}; pathvqa also has no "
        f"'answer_type'); found keys {sorted(keys)}"
    )


def _load(path: Path) -> Any:
    if not path.is_file():
        raise UserError(f"{path}: no such JSON file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text ({error})") from None
    except ValueError as error:  # an integer past Python's digit limit (4300)
        raise UserError(f"{path}: a JSON value Python cannot read ({error})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested deeper than the reader follows (Python's recursion limit)") from None


class _Record:
    """One record of one file: field access with messages naming the file, the record and the field; its images
    confined to the data folder ``root`` (and ``image_root``) unless ``allow`` (``--allow-paths-outside``)."""

    def __init__(self, path: Path, index: int, data: Any, id_key: str | None, *, root: Path,
                 image_root: Path | None = None, allow: bool = False):  # fmt: skip
        self.path, self.index = path, index
        self.root, self.image_root, self.allow = root, image_root, allow
        if not isinstance(data, dict):
            raise BadRecordError(f"{path}: record {index}", f"expected a JSON object, found {type(data).__name__}")
        self.data = data
        raw = data.get(id_key) if id_key else None
        self.id = str(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) and str(raw) else None

    @property
    def where(self) -> str:
        return f"{self.path}: record {self.index}" + (f" ({self.id})" if self.id else "")

    def error(self, name: str, expected: str, found: str) -> BadRecordError:
        return BadRecordError(self.where, f"field '{name}': expected {expected}, found {found}")

    def text(self, name: str, *, numbers: bool = False) -> str:
        """A non-empty string field (numbers too with ``numbers``: VQA-RAD's integer answers), stripped."""
        if name not in self.data:
            raise self.error(name, "a non-empty string", f"no such field (keys {sorted(self.data)})")
        value = self.data[name]
        allowed = (str, int, float) if numbers else (str,)
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise self.error(name, "a non-empty string", f"{type(value).__name__} {value!r:.60}")
        value = str(value).strip()
        if not value:
            raise self.error(name, "a non-empty string", "an empty one")
        return value

    def image(self, name: str, candidates: Iterable[Path]) -> Path:
        """The first existing path among ``candidates`` (for field ``name``), resolved; it (and, for a DICOM series
        folder, every file in it) must lie inside the data folder (`confined`; ``image_root`` for the candidates
        looked for there). A `PathOutsideData` (never a bad record) when the file found lies outside, or when every
        candidate does; a `BadRecordError` when none exists."""
        tried = list(dict.fromkeys(candidates))
        where = f"{self.where}, field '{name}'"
        outside: list[PathOutsideData] = []
        for path in tried:
            root = self.image_root if self.image_root and path.is_relative_to(self.image_root) else self.root
            try:
                try:
                    found = confined(path.absolute(), root, where, self.allow)
                except PathOutsideData as error:
                    if path.exists():
                        raise
                    outside.append(error)
                    continue
                if found.exists():
                    for inner in sorted(found.iterdir()) if found.is_dir() else ():
                        confined(inner, root, where, self.allow)
                    return found
            except (OSError, ValueError, RuntimeError) as error:  # NUL, unencodable, too long, a loop of links
                raise self.error(name, "a file path", f"{path.name!r:.60} ({type(error).__name__}: {error!s:.120})")
        if outside and len(outside) == len(tried):
            raise outside[0]
        looked = ", ".join(str(p) for p in tried[:4])
        raise BadRecordError(self.where, f"field '{name}': image file not found (looked for {looked})")


def _relative(base: Path, image_root: Path | None, name: str) -> list[Path]:
    path = Path(name)
    if path.is_absolute():
        return [path]
    return [*([image_root / path] if image_root else []), base / path]


def _llava(rec: _Record, base: Path, image_root: Path | None) -> list[VlSample]:
    data = rec.data
    images = data.get("image")
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not images or not all(isinstance(x, str) and x.strip() for x in images):
        raise rec.error("image", "an image path (a string, or a list of one)", f"{images!r:.80}")
    if len(images) != 1:
        raise rec.error("image", "one image per record", f"{len(images)} images")
    turns = data["conversations"]
    if not isinstance(turns, list) or not turns or len(turns) % 2:
        found = f"{len(turns)} turns" if isinstance(turns, list) else type(turns).__name__
        raise rec.error("conversations", "a list of human/gpt turn pairs", found)
    for i, turn in enumerate(turns):
        role = "human" if i % 2 == 0 else "gpt"
        if not isinstance(turn, dict) or turn.get("from") != role:
            found = f"{turn.get('from')!r}" if isinstance(turn, dict) else type(turn).__name__
            raise rec.error(f"conversations[{i}].from", f"'{role}' (turns alternate human, gpt)", found)
        value = turn.get("value")
        if not isinstance(value, str) or not value.strip():
            raise rec.error(f"conversations[{i}].value", "a non-empty string", f"{value!r:.60}")
    tokens = sum(turn["value"].count(IMAGE_TOKEN) for turn in turns[::2])
    if tokens != len(images):
        raise BadRecordError(
            rec.where,
            f"field 'conversations': the human turns hold {tokens} '{IMAGE_TOKEN}' token(s) but the record has "
            f"{len(images)} image(s) in field 'image'; expected one token per image",
        )
    task = data.get("task")
    if task is not None and task not in TASK_TYPES:
        raise rec.error("task", f"one of {', '.join(TASK_TYPES)}", f"{task!r:.60}")
    image = rec.image("image", _relative(base, image_root, images[0].strip()))
    target = data.get("target_image")
    coded = all(CODE_TOKEN.search(turn["value"]) for turn in turns[1::2])
    if task in GENERATION_TASKS and target is None and not coded:
        raise rec.error(
            "target_image",
            f"an image path (task '{task}' generates an image), or its VQ codes as <idx_i> tokens in the answer",
            "neither",
        )
    if target is not None:
        if not isinstance(target, str) or not target.strip():
            raise rec.error("target_image", "an image path", f"{target!r:.60}")
        target = rec.image("target_image", _relative(base, image_root, target.strip()))
    findings = data.get("findings") if isinstance(data.get("findings"), dict) else None
    subject = data.get("subject") if isinstance(data.get("subject"), str) else images[0].strip()
    base_id = rec.id or f"{rec.path.stem}-{rec.index}"
    samples = []
    for k in range(len(turns) // 2):
        question = " ".join(turns[2 * k]["value"].replace(IMAGE_TOKEN, " ").split())
        if not question:
            raise rec.error(f"conversations[{2 * k}].value", "a question besides the image token", "none")
        answer = turns[2 * k + 1]["value"].strip()
        sample_id = base_id if len(turns) == 2 else f"{base_id}-{k}"
        kind = task or ("vqa-closed" if answer.lower() in _CLOSED_ANSWERS else "vqa-open")
        samples.append(
            VlSample(
                sample_id,
                kind,
                image,
                question,
                answer,
                target,
                f"{rec.path} record {rec.index} ({sample_id})",
                findings,
                subject,
            )  # fmt: skip
        )
    return samples


def _answer_type(rec: _Record) -> str:
    kind = rec.text("answer_type").upper()
    if kind not in ("CLOSED", "OPEN"):
        raise rec.error("answer_type", "CLOSED or OPEN", repr(rec.data["answer_type"]))
    return "vqa-closed" if kind == "CLOSED" else "vqa-open"


def _vqa_rad(rec: _Record, base: Path, image_root: Path | None) -> VlSample:
    question, answer, task = rec.text("question"), rec.text("answer", numbers=True).lower(), _answer_type(rec)
    name = rec.text("image_name")
    folders = [*([image_root] if image_root else []), base / "VQA_RAD Image Folder", base / "images", base]
    image = rec.image("image_name", [folder / name for folder in folders])
    phrase = rec.text("phrase_type").lower()
    sid = rec.id or f"{rec.path.stem}-{rec.index}"
    split = "test" if phrase in VQA_RAD_TEST_PHRASES else "train"
    return VlSample(sid, task, image, question, answer, None, f"{rec.path} record {rec.index} ({sid})", None, name,
                    split)  # fmt: skip


def _slake(rec: _Record, base: Path, image_root: Path | None) -> VlSample:
    question, answer, task = rec.text("question"), rec.text("answer", numbers=True).lower(), _answer_type(rec)
    name = rec.text("img_name")
    folders = [*([image_root] if image_root else []), base / "imgs", base]
    image = rec.image("img_name", [folder / name for folder in folders])
    sid = rec.id or f"{rec.path.stem}-{rec.index}"
    subject = str(Path(name).parent) if str(Path(name).parent) != "." else name
    return VlSample(sid, task, image, question, answer, None, f"{rec.path} record {rec.index} ({sid})", None, subject)


def _pathvqa(rec: _Record, base: Path, image_root: Path | None) -> VlSample:
    question, answer = rec.text("question"), rec.text("answer", numbers=True).lower()
    name = rec.text("image")
    task = "vqa-closed" if answer in _CLOSED_ANSWERS else "vqa-open"
    prefix = re.match(r"^(train|val|test)_", name)
    splits = [prefix.group(1)] if prefix else []
    roots = [*([image_root] if image_root else []), base, base.parent, base.parent.parent]
    candidates = []
    for root in roots:
        for split in [*splits, "train", "val", "test"]:
            candidates.append(root / "images" / split / f"{name}.jpg")
        candidates += [root / name, root / f"{name}.jpg", root / "images" / f"{name}.jpg"]
    image = rec.image("image", candidates)
    sid = rec.id or f"{rec.path.stem}-{rec.index}"
    return VlSample(sid, task, image, question, answer, None, f"{rec.path} record {rec.index} ({sid})", None, name)


def _refuse_pickle(path: Path) -> None:
    raise UserError(
        f"{path}: a Python pickle; the workbench never loads pickles (loading one runs whatever code it holds). "
        "PathVQA ships its questions as qas/<split>/<split>_qa.pkl: give --data a JSON copy of them instead (the data "
        "card 'pathvqa' shows how to export the pickles you trust to JSON once; parquet copies are not read yet)"
    )


def read_json(
    path: str | Path,
    *,
    image_root: str | Path | None = None,
    report: ReadReport | None = None,
    skipped: SkipReport | None = None,
    language: str = "en",
    data_folder: str | Path | None = None,
    allow_outside: bool = False,
) -> list[VlSample]:
    """The samples of one JSON file in any of `LAYOUTS` (see the module docstring).

    Args:
        path: the JSON file (a list of records).
        image_root: where relative image paths are looked for first (default: beside the JSON file, and the
            layout's image folder there).
        report: filled with the file's layout and the records left out (SLAKE's questions in other languages).
        skipped: where bad records go (and are left out); None raises the first as a `BadRecordError`. Its
            ``seen`` grows by the records looked at (those in ``language``).
        language: SLAKE's ``q_lang`` kept: "en", "zh" or "all" (`LANGUAGES`); ignored by the other layouts.
        data_folder: the folder the user gave, which every image must resolve inside (default: the JSON's folder;
            images looked for under ``image_root`` must resolve inside it). A record naming one outside (``..``, an
            absolute path, a link out) is a `workbench.core.paths.PathOutsideData`, which stops the read: never skipped.
        allow_outside: read such images anyway (``--allow-paths-outside``).
    """
    path = Path(path)
    if path.suffix.lower() in (".pkl", ".pickle"):
        _refuse_pickle(path)
    if language not in LANGUAGES:
        raise UserError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    records = _load(path)
    layout = detect_layout(records, path)
    base = path.parent
    data_root = Path(data_folder) if data_folder is not None else base
    root = Path(image_root) if image_root is not None else None
    if root is not None and not root.is_dir():
        raise UserError(f"image_root {root} is not a folder")
    samples: list[VlSample] = []
    dropped = bad = 0
    id_key = {"llava": "id", "vqa-rad": "qid", "slake": "qid", "pathvqa": "id"}[layout]
    for index, data in enumerate(records):
        try:
            rec = _Record(path, index, data, id_key, root=data_root, image_root=root, allow=allow_outside)
            if layout == "slake" and language != "all" and rec.text("q_lang").lower() != language:
                dropped += 1
                continue
            if skipped is not None:
                skipped.seen += 1
            if layout == "llava":
                if "conversations" not in data:
                    expected = "a list of human/gpt turns (the file is in LLaVA's layout)"
                    raise rec.error("conversations", expected, "none")
                samples += _llava(rec, base, root)
            elif layout == "vqa-rad":
                samples.append(_vqa_rad(rec, base, root))
            elif layout == "slake":
                samples.append(_slake(rec, base, root))
            else:
                samples.append(_pathvqa(rec, base, root))
        except BadRecordError as error:
            if skipped is None:
                raise
            skipped.add(error.record, error.problem)
            bad += 1
    if report is not None:
        report.layouts[str(path)] = layout
        if dropped:
            report.dropped[f"slake questions not in language '{language}' (q_lang)"] += dropped
    if dropped:
        log.info("%s: %d SLAKE questions not in language '%s' left out (--language)", path, dropped, language)
    if not samples:
        raise UserError(
            f"{path}: no usable record ({len(records)} read, {bad} bad, {dropped} not in language '{language}')"
        )
    return samples


#: The keys a questions file's record may name its image by (VQA-RAD's, SLAKE's, PathVQA's and LLaVA's), and its id.
QUESTION_IMAGE_KEYS = ("image_name", "img_name", "image")
QUESTION_ID_KEYS = ("qid", "id")


def read_questions(path: str | Path, *, data_folder: str | Path | None = None,
                   allow_outside: bool = False) -> list[VlSample]:  # fmt: skip
    """The questions of a questions file for batch prediction (``workbench predict``, the service): a JSON list of
    records in any of `LAYOUTS`, answers not needed (and ignored when present).

    A record names its image by ``image_name`` (VQA-RAD), ``img_name`` (SLAKE) or ``image`` (PathVQA, LLaVA: a path
    or a list of one), looked for beside the file, then in its ``images/``, ``imgs/`` and ``VQA_RAD Image Folder/``;
    its question is ``question``, or each human turn of LLaVA's ``conversations`` (one sample per turn, ``<image>``
    dropped); its id is ``qid`` or ``id`` (else ``<file stem>-<index>``; ``-<turn>`` added per LLaVA turn). Samples
    come in file order, with task ``vqa-closed`` and an empty answer.

    Raises:
        UserError: the file is not a JSON list of objects, or a record's question or image field is missing or
            empty, or names an image that does not exist (a `BadRecordError` naming the file, the record and the
            field), or one outside ``data_folder`` (default: the file's folder) without ``allow_outside``.
    """
    path = Path(path)
    records = _load(path)
    if not isinstance(records, list) or not records:
        found = f"a {type(records).__name__}" if not isinstance(records, list) else "an empty list"
        raise UserError(f"{path}: expected a JSON list of question records, found {found}")
    base = path.parent
    root = Path(data_folder) if data_folder is not None else base
    samples: list[VlSample] = []
    for index, data in enumerate(records):
        rec = _Record(path, index, data, next((k for k in QUESTION_ID_KEYS if isinstance(data, dict) and k in data),
                                              None), root=root, allow=allow_outside)  # fmt: skip
        key = next((k for k in QUESTION_IMAGE_KEYS if k in rec.data), None)
        if key is None:
            raise rec.error("image_name", f"an image file name (one of the fields {', '.join(QUESTION_IMAGE_KEYS)})",
                            f"none (keys {sorted(rec.data)})")  # fmt: skip
        name = rec.data[key]
        if isinstance(name, list) and len(name) == 1:
            name = name[0]
        if not isinstance(name, str) or not name.strip():
            raise rec.error(key, "an image file name", f"{name!r:.60}")
        folders = [base, base / "images", base / "imgs", base / "VQA_RAD Image Folder"]
        image = rec.image(key, [Path(name.strip())] if Path(name.strip()).is_absolute() else
                          [folder / name.strip() for folder in folders])  # fmt: skip
        base_id = rec.id or f"{path.stem}-{index}"
        if "conversations" in rec.data and "question" not in rec.data:
            turns = rec.data["conversations"]
            if not isinstance(turns, list) or not turns:
                raise rec.error("conversations", "a list of human/gpt turns", f"{turns!r:.60}")
            asked = []
            for i, turn in enumerate(turns):
                if isinstance(turn, dict) and turn.get("from") == "human":
                    value = turn.get("value")
                    text = " ".join(value.replace(IMAGE_TOKEN, " ").split()) if isinstance(value, str) else ""
                    if not text:
                        raise rec.error(f"conversations[{i}].value", "a question besides the image token", "none")
                    asked.append(text)
            if not asked:
                raise rec.error("conversations", "at least one human turn (a question)", "none")
        else:
            asked = [rec.text("question")]
        for k, question in enumerate(asked):
            sid = base_id if len(asked) == 1 else f"{base_id}-{k}"
            samples.append(VlSample(sid, "vqa-closed", image, question, "", None, f"{path} record {index} ({sid})",
                                    subject=name.strip()))  # fmt: skip
    return samples


def split_by_phrase_type(path: Path, samples: list[VlSample]) -> dict[str, list[VlSample]]:
    """VQA-RAD's published split (``phrase_type``), for a file whose records say it."""
    if any(sample.split is None for sample in samples):
        raise UserError(
            f"{path}: its records do not say their split (only VQA-RAD's phrase_type does); put the splits in "
            "train.json and test.json"
        )
    splits = {name: [s for s in samples if s.split == name] for name in ("train", "test")}
    for name, part in splits.items():
        if not part:
            raise UserError(f"{path}: no {name} question (phrase_type {VQA_RAD_TEST_PHRASES} are test)")
    return splits


def read_folder(
    path: str | Path,
    *,
    image_root: str | Path | None = None,
    report: ReadReport | None = None,
    skipped: SkipReport | None = None,
    language: str = "en",
    allow_outside: bool = False,
) -> dict[str, list[VlSample]]:
    """``{"train": [...], "test": [...]}`` from a folder (or one VQA-RAD JSON file), as the module docstring says:
    ``train.json`` + ``test.json`` or ``trainset.json`` + ``testset.json`` (validation files merged into train), or
    one VQA-RAD JSON split by ``phrase_type``. Images must resolve inside ``path`` (a file's folder); ``skipped``,
    ``language`` and ``allow_outside``: as in `read_json`."""
    path = Path(path)
    options = {"image_root": image_root, "report": report, "skipped": skipped, "language": language,
               "data_folder": path if path.is_dir() else None, "allow_outside": allow_outside}  # fmt: skip
    if path.is_file():
        files = [path]
    elif path.is_dir():
        for train_name, test_name in SPLIT_FILES:
            if (path / train_name).is_file() and (path / test_name).is_file():
                train = read_json(path / train_name, **options)
                for name in VALIDATION_FILES:
                    if (path / name).is_file():
                        train += read_json(path / name, **options)
                return {"train": train, "test": read_json(path / test_name, **options)}
        files = sorted(p for p in path.glob("*.json") if p.name != "generator.json")
        pickles = sorted(path.glob("*.pkl")) + sorted(path.glob("qas/*/*.pkl"))
        if not files and pickles:
            _refuse_pickle(pickles[0])
    else:
        raise UserError(f"{path}: no such folder or file")
    if len(files) != 1:
        found = ", ".join(p.name for p in files) or "no JSON file"
        raise UserError(
            f"{path}: expected train.json and test.json (and optionally {' / '.join(VALIDATION_FILES)}), "
            f"trainset.json and testset.json, or one VQA-RAD JSON file; found {found}"
        )
    return split_by_phrase_type(files[0], read_json(files[0], **options))
