"""The medvl data side: the synthetic CT/MR cross-sections (tissue contrasts, lesion quadrants, shared anatomy,
noise models, reports), the LLaVA records the generator writes and the shipped set, the readers of the published
layouts (told apart by content; what a bad file gets told), and images through MONAI on real sample files."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from workbench.domains.medvl import generate as gen
from workbench.domains.medvl.readers import ReadReport, detect_layout, read_folder, read_json

from workbench.core.datacard import load_card
from workbench.core.errors import UserError
from workbench.core.records import BadRecordError, SkipReport

ndimage = pytest.importorskip("scipy.ndimage")  # the label maps' components and erosions (scipy: not a medvl need)

EMBEDDED = Path(gen.__file__).parent / "embedded"
MID = (64 - 1) / 2


def _subjects(n: int, seed: int = 11) -> list[gen.Subject]:
    rng = np.random.default_rng(seed)
    return [gen.sample_subject(rng) for _ in range(n)]


@pytest.fixture(scope="module")
def subjects() -> list[gen.Subject]:
    return _subjects(40)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("medvl") / "set"
    gen.generate(out, seed=3, train_subjects=8, test_subjects=4)
    return out


def _quadrant(row: float, col: float) -> str:
    return f"{'upper' if row < MID else 'lower'} {'left' if col < MID else 'right'}"


# --- rendering ---------------------------------------------------------------------------------------------------


def test_tissues_have_their_intensity_order_in_each_modality(subjects):
    order = {
        "ct": ("lesion bright", "organ", "soft tissue", "lesion dark", "fat", "air"),
        "mr": ("lesion bright", "fat", "organ", "soft tissue", "lesion dark", "air"),
    }
    for modality, ranking in order.items():
        pooled = {tissue: [] for tissue in gen.TISSUES}
        for subject in subjects:
            image, labels = gen.render(subject, modality), gen.label_map(subject)
            interior = ndimage.binary_erosion(labels == gen.TISSUES.index("organ"), iterations=1)
            for i, tissue in enumerate(gen.TISSUES[:4]):  # away from the partial-volume edges
                pooled[tissue] += image[ndimage.binary_erosion(labels == i, iterations=2)].tolist()
            for lesion in subject.findings.lesions:  # locally (same bias), each lesion against its organ
                distance = np.hypot(*np.indices(labels.shape) - np.array(lesion.centre_px)[:, None, None])
                inside = image[distance < lesion.radius_px - 1.2]
                pooled[f"lesion {lesion.intensity}"] += inside.tolist()
                ring = interior & (distance > lesion.radius_px + 1.5) & (distance < lesion.radius_px + 5)
                contrast = inside.mean() - image[ring].mean()
                assert contrast > 0.05 if lesion.intensity == "bright" else contrast < -0.05
        means = {tissue: float(np.mean(values)) for tissue, values in pooled.items()}
        assert sorted(means, key=means.get, reverse=True) == list(ranking), (modality, means)
        tolerance = 0.03 if modality == "ct" else 0.08  # partial-volume edges; the MR bias field (mean 1)
        for tissue, mean in means.items():
            if tissue != "air":
                assert mean == pytest.approx(gen.INTENSITY[modality][tissue], abs=tolerance), (modality, tissue)


def test_every_lesion_is_in_its_recorded_quadrant_with_its_size_and_intensity(subjects):
    seen = set()
    for subject in subjects:
        labels = gen.label_map(subject)
        lesion = (labels == gen.TISSUES.index("lesion bright")) | (labels == gen.TISSUES.index("lesion dark"))
        components, n = ndimage.label(lesion)
        assert n == len(subject.findings.lesions)
        found = set()
        for k in range(1, n + 1):
            mask = components == k
            rows, cols = np.nonzero(mask)
            quadrant = _quadrant(rows.mean(), cols.mean())
            assert {_quadrant(r, c) for r, c in zip(rows, cols)} == {quadrant}  # wholly inside its quadrant
            size = "small" if mask.sum() < 38 else "large"  # π·3² ≈ 28 px at most, π·4² ≈ 50 px at least
            intensity = "bright" if labels[mask][0] == gen.TISSUES.index("lesion bright") else "dark"
            found.add((quadrant, size, intensity))
        assert found == subject.findings.triples()
        seen |= found
    assert {q for q, _, _ in seen} == set(gen.QUADRANTS) and len(seen) >= 12  # all quadrants, classes mixed


def _explained(image: np.ndarray, labels: np.ndarray, where: np.ndarray) -> float:
    """The share of the image's variance in ``where`` that the label map's class means there explain (R²)."""
    image, labels = image[where], labels[where]
    fitted = np.zeros_like(image)
    for i in np.unique(labels):
        fitted[labels == i] = image[labels == i].mean()
    return float(1 - ((image - fitted) ** 2).sum() / ((image - image.mean()) ** 2).sum())


def test_modalities_share_the_anatomy_but_map_tissues_differently(subjects):
    ranks = {}
    for modality in gen.MODALITIES:
        pooled = [[] for _ in gen.TISSUES]
        for subject, other in zip(subjects[:10], subjects[10:20]):
            image, labels = gen.render(subject, modality), gen.label_map(subject)
            own = _explained(image, labels, labels > 0)  # inside the body: piecewise constant on its label map...
            assert own > 0.7 and own > _explained(image, gen.label_map(other), labels > 0) + 0.08, modality
            for i in range(len(gen.TISSUES)):
                pooled[i] += image[labels == i].tolist()
        ranks[modality] = np.argsort(np.argsort([np.mean(values) for values in pooled]))
    assert (ranks["ct"] != ranks["mr"]).sum() >= 3  # ...whose tissues the two modalities map differently
    fat = gen.TISSUES.index("fat")
    assert ranks["ct"][fat] == 1 and ranks["mr"][fat] >= 4  # second darkest in ct, among the brightest in mr


def test_ct_noise_is_gaussian_and_mr_noise_rician(subjects):
    backgrounds = {m: [] for m in gen.MODALITIES}
    for subject in subjects[:10]:
        air = ndimage.binary_erosion(gen.label_map(subject) == 0, iterations=3)
        for modality in gen.MODALITIES:
            backgrounds[modality] += gen.render(subject, modality)[air].tolist()
    ct, mr = np.array(backgrounds["ct"]), np.array(backgrounds["mr"])
    assert ct.mean() == pytest.approx(gen.INTENSITY["ct"]["air"], abs=0.002)
    assert ct.std() == pytest.approx(gen.CT_NOISE_SD, rel=0.05)
    assert abs(((ct - ct.mean()) ** 3).mean() / ct.std() ** 3) < 0.1  # symmetric
    assert mr.min() > 0 and mr.mean() == pytest.approx(gen.MR_NOISE_SD * np.sqrt(np.pi / 2), rel=0.05)  # Rayleigh
    assert ((mr - mr.mean()) ** 3).mean() / mr.std() ** 3 == pytest.approx(0.631, abs=0.1)  # Rayleigh's skewness


def test_mr_bias_field_is_smooth_positive_and_mean_one_over_the_body(subjects):
    subject = subjects[0]
    field = gen.bias_field(subject, 64, np.random.default_rng(0))
    body = gen.label_map(subject) > 0
    assert field.min() > 0 and field[body].mean() == pytest.approx(1.0)
    assert np.abs(np.diff(field, axis=0)).max() < 0.02 and np.abs(np.diff(field, axis=1)).max() < 0.02
    assert field.max() / field.min() > 1.05  # not flat


def test_render_is_deterministic_per_subject_and_checks_its_modality(subjects):
    np.testing.assert_array_equal(gen.render(subjects[1], "mr"), gen.render(subjects[1], "mr"))
    image = gen.render(subjects[1], "ct", size=32)
    assert image.shape == (32, 32) and image.dtype == np.float32 and 0 <= image.min() and image.max() <= 1
    with pytest.raises(UserError, match="modality must be one of"):
        gen.render(subjects[1], "pet")


def test_reports_round_trip_and_the_parser_reads_what_it_can():
    for subject in _subjects(200, seed=5):
        text = gen.report_text(subject.findings)
        assert gen.report_findings(text) == subject.findings.triples()
        assert (text == "no lesions.") == (not subject.findings.lesions)
        assert set(re.findall(r"[a-z]+|[.?,]", text)) <= set(gen.VOCABULARY)
    assert gen.report_findings("") == set() and gen.report_findings("no lesions.") == set()
    assert gen.report_findings("lorem ipsum <idx_3> dolor ???") == set()
    assert gen.report_findings("a huge bright lesion in the upper left quadrant.") == set()  # no such size
    assert gen.report_findings("a small bright lesion in the middle quadrant.") == set()
    messy = "Findings: A Small  BRIGHT lesion in the\nupper left quadrant!! also a large dark lesion in the lower right"
    assert gen.report_findings(messy + " quadrant, the the") == {("upper left", "small", "bright"),
                                                                 ("lower right", "large", "dark")}  # fmt: skip
    rng = np.random.default_rng(0)
    for _ in range(200):  # model-like junk: random words of the vocabulary
        words = rng.choice(list(gen.VOCABULARY), size=int(rng.integers(0, 30)))
        assert gen.report_findings(" ".join(words)) <= {(q, s, i) for q in gen.QUADRANTS for s in gen.SIZES
                                                        for i in gen.INTENSITIES}  # fmt: skip


def test_findings_json_round_trip(subjects):
    for subject in subjects[:10]:
        back = gen.Findings.from_json(json.dumps(subject.findings.to_json()))
        assert back.triples() == subject.findings.triples()
        for a, b in zip(back.lesions, subject.findings.lesions):
            assert a.radius_px == pytest.approx(b.radius_px, abs=1e-3)
    with pytest.raises(ValueError, match="quadrant"):
        gen.Lesion("middle", "small", "bright")


# --- the generated set --------------------------------------------------------------------------------------------


def test_generated_set_is_llava_records_that_read_back(small_set):
    recipe = json.loads((small_set / "generator.json").read_text())
    splits = read_folder(small_set)
    raw = {name: json.loads((small_set / f"{name}.json").read_text()) for name in ("train", "test")}
    subjects = {name: {r["subject"] for r in records} for name, records in raw.items()}
    assert subjects["train"].isdisjoint(subjects["test"]) and len(subjects["train"]) == 8
    for name, records in raw.items():
        assert len(splits[name]) == len(records) == 8 * len(subjects[name])
        assert {r["task"] for r in records} == set(gen.TASK_TYPES)
        assert recipe["counts"][name]["tasks"] == {t: sum(r["task"] == t for r in records) for t in gen.TASK_TYPES}
        answers = [r["conversations"][1]["value"] for r in records if r["task"] == "vqa-closed"]
        assert abs(answers.count("yes") - answers.count("no")) <= 2 and set(answers) == {"yes", "no"}
        for r in records:
            human, gpt = r["conversations"][0]["value"], r["conversations"][1]["value"]
            assert human.count("<image>") == 1 and human.startswith("<image>\n")
            for text in (human.replace("<image>\n", ""), gpt):
                if text != "<output_image>":
                    assert text == text.lower() and set(re.findall(r"\S+", re.sub(r"[.?,]", " ", text))) <= set(
                        gen.VOCABULARY
                    ), text
                    assert re.fullmatch(r"[a-z .?,]+", text), text
            assert (small_set / r["image"]).is_file()
            if r["task"] in gen.GENERATION_TASKS:
                assert gpt == "<output_image>" and (small_set / r["target_image"]).is_file()
            if r["task"] == "report":
                assert gen.report_findings(gpt) == gen.Findings.from_json(r["findings"]).triples()
        for sample, r in zip(splits[name], records):
            assert (sample.id, sample.task, sample.answer) == (r["id"], r["task"], r["conversations"][1]["value"])
            assert sample.subject == r["subject"] and sample.findings == r["findings"]
    by_task = {r["task"]: r for r in raw["train"] if r["subject"] == "s0001"}
    assert by_task["reconstruct"]["image"] == by_task["reconstruct"]["target_image"] == "images/s0001_ct.png"
    assert by_task["super-resolution"]["image"] == "images/s0001_ct_lowres.png"
    assert by_task["modality-conversion"]["target_image"] == "images/s0001_mr.png"
    modalities = [next(r["modality"] for r in raw["train"] if r["subject"] == s and r["task"] == "report")
                  for s in sorted(subjects["train"])]  # fmt: skip
    assert modalities == ["ct", "mr"] * 4  # comprehension questions alternate between the modalities


def test_generated_images_are_8_bit_gray_and_lowres_is_the_area_average(small_set):
    ct = Image.open(small_set / "images" / "s0002_ct.png")
    low = Image.open(small_set / "images" / "s0002_ct_lowres.png")
    mr = Image.open(small_set / "images" / "s0002_mr.png")
    assert ct.mode == low.mode == mr.mode == "L" and ct.size == mr.size == (64, 64) and low.size == (32, 32)
    expected = (np.asarray(ct, np.float32) / 255).reshape(32, 2, 32, 2).mean(axis=(1, 3))  # 2 × 2 area average
    assert np.abs(np.asarray(low, np.float32) / 255 - expected).max() <= 1.01 / 255
    assert np.abs(np.asarray(ct, np.float32) - np.asarray(mr, np.float32)).mean() > 20  # different contrasts


def test_generate_is_deterministic_for_a_seed(tmp_path, small_set):
    gen.generate(tmp_path / "again", seed=3, train_subjects=8, test_subjects=4)
    gen.generate(tmp_path / "other", seed=4, train_subjects=8, test_subjects=4)
    files = sorted(p.relative_to(small_set) for p in small_set.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file())
    for name in files:
        assert (small_set / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    assert (small_set / "train.json").read_bytes() != (tmp_path / "other" / "train.json").read_bytes()
    with pytest.raises(UserError, match="already exists"):
        gen.generate(tmp_path / "again", seed=3)


def test_embedded_set_reads_back_and_matches_its_card(tmp_path):
    card = load_card("medvl-synthetic").content
    recipe = json.loads((EMBEDDED / "generator.json").read_text())
    splits = read_folder(EMBEDDED)
    counts = recipe["counts"]
    assert len(splits["train"]) + len(splits["test"]) == card["size"]["records"]
    assert counts["train"]["subjects"] + counts["test"]["subjects"] == card["size"]["subjects"]
    assert len(list((EMBEDDED / "images").glob("*.png"))) == card["size"]["images"]
    assert {s.subject for s in splits["train"]}.isdisjoint({s.subject for s in splits["test"]})
    text = " ".join(card["description"].split())
    for task in gen.TASK_TYPES:
        assert f"{task} {counts['train']['tasks'][task]} / {counts['test']['tasks'][task]}" in text, task
    assert f"records {counts['train']['records']} / {counts['test']['records']}" in text
    assert (recipe["seed"], recipe["parameters"]["size_px"]) == (0, 64)
    # the recipe still makes the shipped images (subject k depends only on the seed and k)
    gen.generate(tmp_path / "head", seed=0, train_subjects=2, test_subjects=1)
    for name in ("s0001_ct.png", "s0002_mr.png", "s0003_ct_lowres.png"):
        assert (tmp_path / "head" / "images" / name).read_bytes() == (EMBEDDED / "images" / name).read_bytes()


# --- readers ------------------------------------------------------------------------------------------------------


def _png(path: Path, size=(48, 40), rgb: bool = False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3) if rgb else (size[1], size[0]))
    Image.fromarray(data.astype(np.uint8)).save(path)
    return path.name


def _write(path: Path, records) -> Path:
    path.write_text(json.dumps(records))
    return path


def _llava(**extra):
    record = {
        "id": "q1",
        "image": "img/a.png",
        "conversations": [{"from": "human", "value": "<image>\nIs there a mass?"}, {"from": "gpt", "value": "Yes"}],
    }
    return {**record, **extra}


def _vqa_rad(qid, phrase, answer="Yes", answer_type="CLOSED"):
    record = {"qid": qid, "image_name": "synpic1.jpg", "image_organ": "HEAD", "question": "Is this an MRI?"}
    return {**record, "answer": answer, "answer_type": answer_type, "question_type": "PRES", "phrase_type": phrase}


def _slake(qid, lang="en", answer="CT", answer_type="OPEN"):
    return {"img_id": 1, "img_name": "xmlab1/source.jpg", "question": "Which modality?", "answer": answer,
            "q_lang": lang, "location": "Lung", "modality": "CT", "answer_type": answer_type, "base_type": "vqa",
            "content_type": "Modality", "triple": ["vhead", "_", "_"], "qid": qid}  # fmt: skip


def test_layouts_are_told_apart_by_their_records_not_their_names(tmp_path):
    _png(tmp_path / "img" / "a.png")
    _png(tmp_path / "VQA_RAD Image Folder" / "synpic1.jpg", rgb=True)
    _png(tmp_path / "imgs" / "xmlab1" / "source.jpg", rgb=True)
    _png(tmp_path / "images" / "train" / "train_0001.jpg", rgb=True)
    files = {
        "llava": _write(tmp_path / "slake.json", [_llava()]),  # names that say otherwise
        "vqa-rad": _write(tmp_path / "llava.json", [_vqa_rad(1, "freeform")]),
        "slake": _write(tmp_path / "pathvqa.json", [_slake(1)]),
        "pathvqa": _write(tmp_path / "vqa_rad.json", [{"image": "train_0001", "question": "Is it?", "answer": "no"}]),
    }
    report = ReadReport()
    for layout, path in files.items():
        assert detect_layout(json.loads(path.read_text()), path) == layout
        (sample,) = read_json(path, report=report)
        assert sample.image.is_file() and sample.source.startswith(str(path))
    assert report.layouts == {str(p): layout for layout, p in files.items()}
    samples = {layout: read_json(path)[0] for layout, path in files.items()}
    assert (samples["llava"].question, samples["llava"].answer, samples["llava"].task) == ("Is there a mass?", "Yes",
                                                                                          "vqa-closed")  # fmt: skip
    assert samples["pathvqa"].task == "vqa-closed" and samples["pathvqa"].image.name == "train_0001.jpg"
    assert samples["slake"].task == "vqa-open" and samples["slake"].answer == "ct"
    odd = _write(tmp_path / "odd.json", [{"picture": "a.png", "q": "?", "a": "yes"}])
    with pytest.raises(UserError, match=r"odd\.json: record 0 fits none of the layouts.*vqa-rad: image_name"):
        read_json(odd)
    with pytest.raises(UserError, match="expected a JSON list of records, found a dict"):
        read_json(_write(tmp_path / "dict.json", {"questions": []}))
    (tmp_path / "broken.json").write_text("[{")
    with pytest.raises(UserError, match=r"broken\.json: not valid JSON"):
        read_json(tmp_path / "broken.json")


def test_vqa_rad_is_split_by_phrase_type_and_its_answers_normalised(tmp_path):
    _png(tmp_path / "VQA_RAD Image Folder" / "synpic1.jpg", rgb=True)
    records = [
        _vqa_rad(1, "freeform"),
        _vqa_rad(2, "para", answer=2, answer_type="OPEN"),
        _vqa_rad(3, "test_freeform", answer=" No "),
        _vqa_rad(4, "test_para", answer="Left", answer_type="OPEN"),
    ]
    _write(tmp_path / "VQA_RAD Dataset Public.json", records)
    splits = read_folder(tmp_path)
    assert [s.id for s in splits["train"]] == ["1", "2"] and [s.id for s in splits["test"]] == ["3", "4"]
    assert [s.answer for s in splits["train"] + splits["test"]] == ["yes", "2", "no", "left"]
    assert [s.task for s in splits["train"] + splits["test"]] == ["vqa-closed", "vqa-open", "vqa-closed", "vqa-open"]
    assert read_folder(tmp_path / "VQA_RAD Dataset Public.json")["test"][0].id == "3"  # the file itself works too
    _write(tmp_path / "VQA_RAD Dataset Public.json", [_vqa_rad(1, "freeform", answer_type="MAYBE")])
    with pytest.raises(UserError, match=r"record 0 \(1\): field 'answer_type': expected CLOSED or OPEN"):
        read_folder(tmp_path)
    _write(tmp_path / "VQA_RAD Dataset Public.json", [_vqa_rad(1, "freeform"), {**_vqa_rad(2, "para"), "answer": None}])
    with pytest.raises(UserError, match=r"record 1 \(2\): field 'answer': expected a non-empty string, found NoneType"):
        read_folder(tmp_path)
    _write(tmp_path / "VQA_RAD Dataset Public.json", [{**_vqa_rad(1, "freeform"), "question": "  "}])
    with pytest.raises(UserError, match=r"record 0 \(1\): field 'question': expected a non-empty string"):
        read_folder(tmp_path)


def test_slake_keeps_english_and_merges_validation_into_train(tmp_path):
    _png(tmp_path / "imgs" / "xmlab1" / "source.jpg", rgb=True)
    _write(tmp_path / "train.json", [_slake(1), _slake(2, lang="zh", answer="计算机断层扫描"), _slake(3)])
    _write(tmp_path / "validate.json", [_slake(4), _slake(5, lang="zh")])
    _write(tmp_path / "test.json", [_slake(6, answer="Yes", answer_type="CLOSED"), _slake(7, lang="zh")])
    report = ReadReport()
    splits = read_folder(tmp_path, report=report)
    assert [s.id for s in splits["train"]] == ["1", "3", "4"] and [s.id for s in splits["test"]] == ["6"]
    assert splits["test"][0].task == "vqa-closed" and splits["test"][0].subject == "xmlab1"
    assert sum(report.dropped.values()) == 3 and "q_lang" in report.summary()
    chinese = read_folder(tmp_path, language="zh")
    assert [s.id for s in chinese["train"]] == ["2", "5"] and chinese["train"][0].answer == "计算机断层扫描"
    assert [s.id for s in read_folder(tmp_path, language="all")["train"]] == ["1", "2", "3", "4", "5"]
    with pytest.raises(UserError, match="language must be one of en, zh, all"):
        read_folder(tmp_path, language="fr")
    _write(tmp_path / "test.json", [_slake(7, lang="zh")])
    with pytest.raises(UserError, match=r"test\.json: no usable record \(1 read, 0 bad, 1 not in language 'en'\)"):
        read_folder(tmp_path)


def test_bad_records_are_raised_or_skipped_into_a_report_and_counted(tmp_path):
    _png(tmp_path / "imgs" / "xmlab1" / "source.jpg", rgb=True)
    records = [_slake(1), {**_slake(2), "img_name": "xmlab9/source.jpg"}, {**_slake(3), "answer": ""}, _slake(4)]
    _write(tmp_path / "train.json", records + [_slake(5, lang="zh")])
    _write(tmp_path / "test.json", [_slake(6)])
    with pytest.raises(BadRecordError, match=r"train\.json: record 1 \(2\): field 'img_name': image file not found"):
        read_folder(tmp_path)
    skipped = SkipReport()
    splits = read_folder(tmp_path, skipped=skipped)
    assert [s.id for s in splits["train"]] == ["1", "4"] and skipped.seen == 5  # 4 English train + 1 test
    assert [p.record for p in skipped] == [f"{tmp_path / 'train.json'}: record {i} ({i + 1})" for i in (1, 2)]
    assert "image file not found" in skipped.problems[0].problem and "'answer'" in skipped.problems[1].problem


def test_pathvqa_images_are_found_by_their_split(tmp_path):
    _png(tmp_path / "images" / "test" / "test_0007.jpg", rgb=True)
    _png(tmp_path / "images" / "train" / "train_0003.jpg", rgb=True)
    _write(tmp_path / "train.json", [{"image": "train_0003", "question": "what organ?", "answer": "Liver"}])
    _write(tmp_path / "val.json", [{"image": "train_0003", "question": "is it benign?", "answer": "yes"}])
    _write(tmp_path / "test.json", [{"image": "test_0007", "question": "is it?", "answer": "no"}])
    splits = read_folder(tmp_path)
    assert [(s.task, s.answer) for s in splits["train"]] == [("vqa-open", "liver"), ("vqa-closed", "yes")]
    assert splits["test"][0].image == (tmp_path / "images" / "test" / "test_0007.jpg").resolve()
    _write(tmp_path / "test.json", [{"image": "test_0008", "question": "is it?", "answer": "no"}])
    with pytest.raises(UserError, match=r"test\.json: record 0: field 'image': image file not found"):
        read_folder(tmp_path)


def test_llava_records_are_checked(tmp_path):
    _png(tmp_path / "img" / "a.png")
    path = tmp_path / "data.json"

    def fails(record, match):
        _write(path, [_llava(), record])
        with pytest.raises(UserError, match=match):
            read_json(path)

    two_tokens = [{"from": "human", "value": "<image><image>\nwhat?"}, {"from": "gpt", "value": "x"}]
    fails(_llava(id="q2", conversations=two_tokens),
          r"data\.json: record 1 \(q2\): field 'conversations': the human turns hold 2 '<image>' token\(s\) but the "
          r"record has 1 image\(s\)")  # fmt: skip
    no_token = [{"from": "human", "value": "what?"}, {"from": "gpt", "value": "x"}]
    fails(_llava(id="q2", conversations=no_token), "hold 0 '<image>' token")
    fails(_llava(id="q2", task="segmentation"), r"record 1 \(q2\): field 'task': expected one of vqa-closed, vqa-open")
    fails(_llava(id="q2", image="img/missing.png"), r"record 1 \(q2\): field 'image': image file not found")
    fails(_llava(id="q2", task="reconstruct"), r"record 1 \(q2\): field 'target_image': expected an image path")
    coded = [{"from": "human", "value": "<image>\nreconstruct the image."}, {"from": "gpt", "value": "<idx_3><idx_9>"}]
    _write(path, [_llava(id="q3", task="reconstruct", conversations=coded)])
    assert read_json(path)[0].target_image is None  # HealthGPT's layout: the image as VQ code tokens
    fails(_llava(id="q2", task="reconstruct", target_image="img/none.png"), r"field 'target_image': image file not")
    empty = [{"from": "human", "value": "<image>\nwhat?"}, {"from": "gpt", "value": " "}]
    fails(_llava(id="q2", conversations=empty), r"field 'conversations\[1\]\.value': expected a non-empty string")
    swapped = [{"from": "gpt", "value": "<image>\nwhat?"}, {"from": "human", "value": "x"}]
    fails(_llava(id="q2", conversations=swapped), r"field 'conversations\[0\]\.from': expected 'human'")
    fails(_llava(id="q2", image=["img/a.png", "img/a.png"]), "field 'image': expected one image per record")
    fails({"id": "q2", "image": "img/a.png"}, r"record 1 \(q2\): field 'conversations'")


def test_llava_turns_tasks_and_targets(tmp_path):
    _png(tmp_path / "img" / "a.png")
    _png(tmp_path / "img" / "b.png")
    turns = [{"from": "human", "value": "<image>\nwhat organ?"}, {"from": "gpt", "value": "the liver"},
             {"from": "human", "value": "is it  enlarged?"}, {"from": "gpt", "value": "no"}]  # fmt: skip
    records = [_llava(id="m", conversations=turns, subject="p7"),
               _llava(id="g", task="modality-conversion", image=["img/a.png"], target_image="img/b.png")]  # fmt: skip
    first, second, third = read_json(_write(tmp_path / "train.json", records))
    assert (first.id, first.task, first.question) == ("m-0", "vqa-open", "what organ?")
    assert (second.id, second.task, second.question, second.subject) == ("m-1", "vqa-closed", "is it enlarged?", "p7")
    assert third.task == "modality-conversion" and third.target_image == (tmp_path / "img" / "b.png").resolve()
    assert third.subject == "img/a.png"


# --- images through MONAI ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def load_image():
    pytest.importorskip("monai")
    from workbench.domains.medvl.images import load_image

    return load_image


def _scaled(array) -> np.ndarray:
    array = np.asarray(array, np.float64)
    return (array - array.min()) / (array.max() - array.min())


def test_dicom_samples_load_in_row_column_order(load_image):
    pydicom = pytest.importorskip("pydicom")
    from pydicom.data import get_testdata_file

    for name, side in (("CT_small.dcm", 128), ("MR_small.dcm", 64)):
        path = get_testdata_file(name)
        image = load_image(path, size=side)
        assert image.shape == (1, side, side) and image.dtype == torch.float32 and torch.isfinite(image).all()
        assert image.min() == 0 and image.max() == 1
        np.testing.assert_allclose(image[0].numpy(), _scaled(pydicom.dcmread(path).pixel_array), atol=1e-5)
        small = load_image(path)
        assert small.shape == (1, 64, 64) and 0 <= small.min() and small.max() <= 1


def test_dicom_series_folder_gives_its_middle_slice(load_image, tmp_path):
    pydicom = pytest.importorskip("pydicom")
    from pydicom.data import get_testdata_file

    base = pydicom.dcmread(get_testdata_file("MR_small.dcm"))
    slices = [base.pixel_array, base.pixel_array[:, ::-1], base.pixel_array[::-1, :]]
    for k, pixels in enumerate(slices):
        ds = copy.deepcopy(base)
        ds.PixelData = np.ascontiguousarray(pixels).tobytes()
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [
            *map(float, base.ImagePositionPatient[:2]),
            float(base.ImagePositionPatient[2]) + 5 * k,
        ]
        ds.SOPInstanceUID = pydicom.uid.generate_uid()
        ds.save_as(tmp_path / f"slice-{2 - k}.dcm")  # file names in the opposite order
    image = load_image(tmp_path, size=64)
    np.testing.assert_allclose(image[0].numpy(), _scaled(slices[1]), atol=1e-5)


def test_nifti_volume_gives_its_middle_slice_and_4d_is_refused(load_image):
    nibabel = pytest.importorskip("nibabel")
    data = Path(nibabel.__file__).parent / "tests" / "data"
    volume = np.asarray(nibabel.load(data / "anatomical.nii").dataobj, np.float64)  # (33, 41, 25)
    image = load_image(data / "anatomical.nii")
    assert image.shape == (1, 64, 64) and torch.isfinite(image).all() and 0 <= image.min() and image.max() <= 1
    middle = torch.from_numpy(_scaled(volume[:, :, volume.shape[2] // 2].T)).float()[None, None]  # (1, 1, 41, 33)
    expected = torch.nn.functional.interpolate(middle, size=(64, 64), mode="bilinear", align_corners=False)
    np.testing.assert_allclose(image[0].numpy(), expected[0, 0].numpy(), atol=1e-4)
    with pytest.raises(UserError, match=r"q\.json record 2 \(x\): field 'image': .*example4d\.nii\.gz is 4-D"):
        load_image(data / "example4d.nii.gz", source="q.json record 2 (x)")


def test_png_keeps_its_orientation_and_channels_convert(load_image, tmp_path):
    gray = np.zeros((40, 48), np.uint8)  # 40 rows, 48 columns: not square
    gray[:8, :8] = 255  # upper left
    gray[32:, 12:48] = 128  # a wide bar along the bottom
    Image.fromarray(gray).save(tmp_path / "gray.png")
    image = load_image(tmp_path / "gray.png")[0].numpy()
    assert image[:10, :8].mean() > 0.9 and image[:10, -8:].max() < 0.05 and image[-10:, :8].max() < 0.05
    assert image[-8:, 24:].mean() == pytest.approx(128 / 255, abs=0.02)  # rows stay rows
    rgb = np.zeros((40, 48, 3), np.uint8)  # black in the middle
    rgb[:16, :, 0] = 255  # red top
    rgb[24:, :, 2] = 255  # blue bottom
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    Image.fromarray(rgb).save(tmp_path / "rgb.jpg", quality=95)
    Image.fromarray(np.dstack([rgb, np.zeros((40, 48), np.uint8)])).save(tmp_path / "rgba.png")  # fully transparent
    for name in ("rgb.png", "rgba.png", "rgb.jpg"):
        out = load_image(tmp_path / name)[0].numpy()
        assert out[:20].mean() == pytest.approx(1.0, abs=0.03), name  # red: luminance 0.299, the brightest
        assert out[-20:].mean() == pytest.approx(0.114 / 0.299, abs=0.03), name  # blue: 0.114, of black 0
        assert out[29:35].max() < 0.05, name
    colour = load_image(tmp_path / "rgb.png", channels=3)
    assert colour.shape == (3, 64, 64) and colour[0, :16].mean() > 0.95 and colour[2, :16].max() < 0.05
    repeated = load_image(tmp_path / "gray.png", channels=3)
    assert repeated.shape == (3, 64, 64) and torch.equal(repeated[0], repeated[2])


def test_bad_images_are_refused_with_the_record_and_field(load_image, tmp_path):
    where = r"t\.json record 3 \(q9\): field 'target_image'"
    with pytest.raises(UserError, match=where + r": image file .*none\.png does not exist"):
        load_image(tmp_path / "none.png", field="target_image", source="t.json record 3 (q9)")
    (tmp_path / "junk.png").write_bytes(b"not an image" * 10)
    with pytest.raises(UserError, match=where + r": cannot read .*junk\.png as an image"):
        load_image(tmp_path / "junk.png", field="target_image", source="t.json record 3 (q9)")
    (tmp_path / "junk.dcm").write_bytes(b"not a dicom" * 10)
    with pytest.raises(UserError, match=r"cannot read .*junk\.dcm as DICOM"):
        load_image(tmp_path / "junk.dcm")
    _png(tmp_path / "small.png", size=(48, 20))
    with pytest.raises(UserError, match=r"small\.png is 20 × 48 px; expected at least 32 px on each side"):
        load_image(tmp_path / "small.png")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="expected an image file"):
        load_image(tmp_path / "notes.txt")
    nibabel = pytest.importorskip("nibabel")
    values = np.ones((40, 40, 3), np.float32)
    values[3, 4, 1] = np.nan
    nibabel.save(nibabel.Nifti1Image(values, np.eye(4)), tmp_path / "nan.nii.gz")
    with pytest.raises(UserError, match=r"nan\.nii\.gz has 1 NaN or infinite values"):
        load_image(tmp_path / "nan.nii.gz")
    from workbench.domains.medvl.images import _to_channels

    with pytest.raises(UserError, match="has 2 channels; expected 1 .gray., 3 .RGB. or 4"):
        _to_channels(torch.zeros(2, 40, 40), 1, "field 'image'", "two.tif")
    with pytest.raises(UserError, match="channels must be 1 or 3"):
        load_image(tmp_path / "gray.png", channels=2)


def test_the_package_does_not_import_monai():
    code = "import sys, workbench.domains.medvl.readers; print('monai' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
