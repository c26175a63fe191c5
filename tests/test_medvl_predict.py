"""medvl closed VQA answered in batches and served: a finished run on the closed questions of the embedded synthetic
set (H-LoRA, 1 epoch) writes its clinical layer; ``workbench predict`` on a folder of images and a questions file
writes each answer's probability (reference: the model's own teacher-forced likelihood of each answer, and the task's
``evaluate`` on the same questions), calibrated probabilities and conformal sets; a damaged image is a status row, a
questions file naming a missing image a one-line error; ``workbench calibrate`` fits a site layer on labelled
closed questions that ``predict --calibration`` uses; the service answers an upload and an intake folder, audits
them, and refuses a questions file or an image above its limits. On mixed data (open questions, reports, generation)
closed questions are still ranked, decoding gives the shift alarm no feature rows, and no clinical layer is fitted."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli

pytest.importorskip("monai")
pytest.importorskip("transformers")

from workbench.domains.medvl.closed import answer_probabilities  # noqa: E402
from workbench.domains.medvl.task import EMBEDDED  # noqa: E402
from workbench.models.medvl import IGNORE  # noqa: E402

from workbench.clinical import shift_alarm  # noqa: E402
from workbench.core.finished import Run  # noqa: E402
from workbench.core.registry import tasks  # noqa: E402
from workbench.core.task import TaskData  # noqa: E402

#: Questions of the embedded test split scored in the folder (6 images, 2 questions each).
N_QUESTIONS = 12
TOKEN = "m" * 24


@pytest.fixture(scope="module")
def closed_data(tmp_path_factory) -> Path:
    """The embedded set's closed questions (192 train, 64 test; yes / no) and their images."""
    out = tmp_path_factory.mktemp("medvl-closed") / "data"
    (out / "images").mkdir(parents=True)
    for split in ("train", "test"):
        records = [r for r in json.loads((EMBEDDED / f"{split}.json").read_text()) if r["task"] == "vqa-closed"]
        for record in records:
            shutil.copy(EMBEDDED / record["image"], out / record["image"])
        (out / f"{split}.json").write_text(json.dumps(records))
    return out


@pytest.fixture(scope="module")
def run_dir(closed_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("medvl-run") / "run"
    result = cli("adapt", "--domain", "medvl", "--data", str(closed_data), "--method", "hlora", "--baselines", "",
                 "--epochs", "1", "--val-share", "0.35", "--quiet", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


def questions(closed_data: Path) -> list[dict]:
    """The first `N_QUESTIONS` test questions in VQA-RAD's keys (image_name, question, qid), no answers."""
    records = json.loads((closed_data / "test.json").read_text())[:N_QUESTIONS]
    return [{"qid": r["id"], "image_name": Path(r["image"]).name,
             "question": r["conversations"][0]["value"].replace("<image>", " ").strip()} for r in records]  # fmt: skip


def intake_folder(closed_data: Path, folder: Path, asked: list[dict]) -> Path:
    (folder / "images").mkdir(parents=True)
    for record in asked:
        if (closed_data / "images" / record["image_name"]).is_file():
            shutil.copy(closed_data / "images" / record["image_name"], folder / "images" / record["image_name"])
    (folder / "questions.json").write_text(json.dumps(asked))
    return folder


def read_csv(path: Path) -> list[dict]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def likelihood_reference(model, images: torch.Tensor, asked: list[str], classes: list[str]) -> np.ndarray:
    """Each answer's probability from the model's ordinary forward (right-padded, teacher-forced: the loss's
    path): softmax over the answers of Σ log p(answer tokens, <eos>)."""
    scores = []
    with torch.no_grad():
        for answer in classes:
            batch = model.encode_batch(images, asked, [answer] * len(asked))
            logits = model(**batch).logits[:, :-1].double()
            labels = batch["labels"][:, 1:]
            chosen = labels != IGNORE
            picked = torch.log_softmax(logits, -1).gather(-1, labels.clamp_min(0)[..., None])[..., 0]
            scores.append((picked * chosen).sum(1))
    return torch.softmax(torch.stack(scores, 1), 1).numpy()


def test_predict_writes_calibrated_answers_sets_and_a_status_row_for_a_damaged_image(run_dir, closed_data, tmp_path):
    asked = questions(closed_data) + [{"qid": "damaged", "image_name": "damaged.png", "question": "are there any "
                                       "lesions?"}]  # fmt: skip
    folder = intake_folder(closed_data, tmp_path / "in", asked)
    (folder / "images" / "damaged.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a cut-off PNG
    result = cli("predict", "--run", str(run_dir), "--input", str(folder), "--output", str(tmp_path / "out.csv"))
    assert result.returncode == 0, result.stderr
    rows = read_csv(tmp_path / "out.csv")
    assert len(rows) == N_QUESTIONS + 1
    bad = rows[-1]
    assert bad["question_id"] == "damaged" and bad["status"].startswith("error: ") and "damaged.png" in bad["status"]
    assert bad["p_yes"] == bad["predicted"] == bad["conformal_set"] == ""
    ok = rows[:-1]
    assert [r["question_id"] for r in ok] == [a["qid"] for a in asked[:-1]] and {r["status"] for r in ok} == {"ok"}
    p = np.array([[float(r["p_no"]), float(r["p_yes"])] for r in ok])
    calibrated = np.array([[float(r["calibrated_p_no"]), float(r["calibrated_p_yes"])] for r in ok])
    np.testing.assert_allclose(p.sum(1), 1, atol=2e-6)
    np.testing.assert_allclose(calibrated.sum(1), 1, atol=2e-6)
    assert [r["predicted"] for r in ok] == [("no", "yes")[k] for k in p.argmax(1)]
    clinical = json.loads((run_dir / "clinical.json").read_text())
    temperature = clinical["calibration"]["temperatures"][0]
    assert clinical["calibration"]["fit_items"] >= 30  # a fitted temperature, not T = 1
    scaled = p ** (1 / temperature)  # softmax(log p / T), by hand
    np.testing.assert_allclose(calibrated, scaled / scaled.sum(1, keepdims=True), atol=1e-5)
    threshold = clinical["conformal"]["quantiles"][0]
    for row, q in zip(ok, calibrated):  # split conformal: every answer whose score 1 - p is within the threshold
        assert row["conformal_set"].split("|") == [c for c, pk in zip(("no", "yes"), q) if 1 - pk <= threshold + 1e-6]
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["classes"] == ["no", "yes"] and record["records"] == N_QUESTIONS + 1 and record["failed"] == 1
    assert record["clinical"]["sets"]["items"] == N_QUESTIONS
    assert record["clinical"]["shift"]["batch"] == N_QUESTIONS  # one feature row per answered question

    # the same questions through the task's evaluate, and the likelihoods from the model's ordinary forward
    finished = Run.load(run_dir, "cpu")
    config, state = finished.config, json.loads((run_dir / "adapter.json").read_text())["task_state"]
    task = tasks.get("medvl")(**config.task_options)
    task.restore(finished.model, state)
    items = task.test_samples(finished.model, task.read(str(closed_data)))[:N_QUESTIONS]
    assert shift_alarm.feature_module(finished.model) is finished.model.lm.lm_head  # the ModelSpec's head
    evaluation, features = shift_alarm.model_features(finished.model, lambda: task.evaluate(finished.model, items,
                                                                                            "cpu"))  # fmt: skip
    assert features.shape == (N_QUESTIONS, finished.model.config.lm_hidden)
    assert evaluation.predictions["probabilities_item"].tolist() == list(range(N_QUESTIONS))
    np.testing.assert_allclose(evaluation.predictions["probabilities"], p, atol=1e-5)
    assert evaluation.predictions["probabilities"].argmax(1).tolist() == p.argmax(1).tolist()
    truth = [("no", "yes").index(item.answer) for item in items]
    assert evaluation.predictions["truth"].tolist() == truth
    images = torch.stack([item.image for item in items])
    reference = likelihood_reference(finished.model, images, [item.question for item in items], ["no", "yes"])
    np.testing.assert_allclose(p, reference, atol=1e-5)
    direct = answer_probabilities(finished.model, images, [item.question for item in items], ["no", "yes"])
    np.testing.assert_allclose(direct, reference, atol=1e-5)


def test_a_questions_file_naming_a_missing_image_is_one_line_naming_the_file_record_and_field(run_dir, closed_data,
                                                                                              tmp_path):  # fmt: skip
    asked = questions(closed_data)[:2] + [{"qid": "q3", "image_name": "not-there.png", "question": "any lesions?"}]
    folder = intake_folder(closed_data, tmp_path / "in", asked)
    result = cli("predict", "--run", str(run_dir), "--input", str(folder), "--output", str(tmp_path / "out.csv"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "questions.json: record 2 (q3)" in line and "field 'image_name'" in line and "not-there.png" in line
    assert not (tmp_path / "out.csv").exists()
    (folder / "questions.json").write_text(json.dumps([{"qid": "q1", "image_name": asked[0]["image_name"]}]))
    result = cli("predict", "--run", str(run_dir), "--input", str(folder), "--output", str(tmp_path / "out.csv"))
    assert result.returncode == 2 and "record 0 (q1)" in result.stderr and "field 'question'" in result.stderr


def test_a_site_calibration_layer_on_labelled_closed_questions_is_what_predict_uses(run_dir, closed_data, tmp_path):
    layer = tmp_path / "layer"
    result = cli("calibrate", "--run", str(run_dir), "--data", str(closed_data), "--out", str(layer))
    assert result.returncode == 0, result.stderr
    site = json.loads((layer / "clinical.json").read_text())
    report = site["site_report"]
    assert report["trials"] == report["items"] > 0 and report["covered"] <= report["items"]
    assert report["coverage"] == pytest.approx(report["covered"] / report["trials"])
    assert set(report["set_frequency"]) == {"no", "yes"} and 1 <= report["mean_set_size"] <= 2
    folder = intake_folder(closed_data, tmp_path / "in", questions(closed_data))
    result = cli("predict", "--run", str(run_dir), "--calibration", str(layer), "--input", str(folder), "--output",
                 str(tmp_path / "out.csv"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = read_csv(tmp_path / "out.csv")
    p = np.array([[float(r["p_no"]), float(r["p_yes"])] for r in rows])
    scaled = p ** (1 / site["calibration"]["temperatures"][0])  # the layer's temperature, not the run's
    calibrated = np.array([[float(r["calibrated_p_no"]), float(r["calibrated_p_yes"])] for r in rows])
    np.testing.assert_allclose(calibrated, scaled / scaled.sum(1, keepdims=True), atol=1e-5)


def test_on_mixed_data_closed_questions_are_ranked_and_fit_the_layer_and_decoding_gives_the_alarm_no_features(tmp_path):
    from workbench.domains.medvl.generate import generate

    from workbench.clinical.fit import fit_run

    generate(tmp_path / "data", seed=3, train_subjects=6, test_subjects=3)
    task = tasks.get("medvl")(max_answer_words=4)
    model = task.load_model(None, False)
    data, state = task.prepare(model, task.read(str(tmp_path / "data")), 1000, 1000, 0)
    assert state["classes"] == ["no", "yes"]
    first = {}
    for item in data.test:  # two closed questions, then one item of each other sub-task
        first.setdefault(item.task, []).append(item)
    items = first["vqa-closed"][:2] + [first[t][0] for t in ("vqa-open", "reconstruct")]
    evaluation, features = shift_alarm.model_features(model, lambda: task.evaluate(model, items, "cpu"))
    assert features.shape == (2, model.config.lm_hidden)  # greedy decoding and generation: no rows
    assert evaluation.predictions["probabilities_item"].tolist() == [0, 1]
    np.testing.assert_allclose(evaluation.predictions["probabilities"].sum(1), 1, atol=1e-12)
    assert fit_run(task, model, TaskData(data.train[:4], items, items, data.source), tmp_path, 0) is None  # 2 scored
    assert not (tmp_path / "clinical.json").exists()
    # the layer of mixed data rests on its closed questions alone: their probabilities and their features
    by_task: dict[str, list] = {}
    for item in data.train + data.test:
        by_task.setdefault(item.task, []).append(item)
    val = by_task["vqa-closed"][:4] + [by_task[t][0] for t in ("vqa-open", "reconstruct")]
    train = by_task["vqa-closed"][4:7] + by_task["vqa-open"][1:3]
    summary = fit_run(task, model, TaskData(train, val, items, data.source), tmp_path, 0)
    assert summary is not None and "6 items, 4 of them scored" in summary["split"]
    assert summary["calibration"]["fit_items"] == 2 and summary["conformal"]["calibration_items"] == 2
    assert summary["conformal"]["test_items"] == 2
    arrays = np.load(tmp_path / "clinical.npz")
    assert arrays["reference_features"].shape == (3, model.config.lm_hidden)  # the 3 closed training questions
    assert arrays["calibration_probabilities"].shape == (2, 2)


def png_header(width: int, height: int) -> bytes:
    """A PNG signature and IHDR chunk declaring ``width`` × ``height`` (no pixel data follows)."""
    body = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body + struct.pack(">I", zlib.crc32(body))


def test_the_service_answers_an_upload_and_an_intake_folder_audits_them_and_bounds_questions(run_dir, closed_data,
                                                                                             tmp_path):  # fmt: skip
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from workbench.clinical.predictor import ClinicalPredictor
    from workbench.serve.app import create_app
    from workbench.serve.audit import AuditLog, verify_log
    from workbench.serve.auth import parse_tokens
    from workbench.serve.limits import Limits

    asked = questions(closed_data)[:2]  # two questions about one image
    assert asked[0]["image_name"] == asked[1]["image_name"]
    intake = tmp_path / "intake"
    flat = intake / "case1"
    flat.mkdir(parents=True)
    shutil.copy(closed_data / "images" / asked[0]["image_name"], flat / asked[0]["image_name"])
    (flat / "questions.json").write_text(json.dumps(asked))
    audit = AuditLog(tmp_path / "audit.jsonl")
    predictor = ClinicalPredictor.load(run_dir, device="cpu")
    limits = Limits(timeout_s=60, max_questions=4, max_pixels=1_000_000)
    app = create_app(predictor, parse_tokens(f"ward-7 {TOKEN}", "test"), audit, limits, intake=intake.resolve())
    auth = {"Authorization": f"Bearer {TOKEN}"}
    files = {name: (flat / name).read_bytes() for name in (asked[0]["image_name"], "questions.json")}
    with TestClient(app) as client:
        answered = client.post("/predict", headers=auth, files=[("file", (n, b)) for n, b in files.items()])
        by_path = client.post("/predict", headers=auth, json={"path": "case1"})
        many = json.dumps([asked[0]] * 5).encode()
        too_many = client.post("/predict", headers=auth, files=[("file", ("questions.json", many)),
                                                                ("file", (asked[0]["image_name"],
                                                                          files[asked[0]["image_name"]]))])  # fmt: skip
        too_large = client.post("/predict", headers=auth, files=[("file", ("questions.json", files["questions.json"])),
                                                                 ("file", (asked[0]["image_name"],
                                                                           png_header(2000, 2000)))])  # fmt: skip
    audit.close()
    assert answered.status_code == 200, answered.text
    results = answered.json()["results"]
    assert [r["where"]["question_id"] for r in results] == [a["qid"] for a in asked]
    for result in results:
        assert result["status"] == "ok" and result["labels"] in (["no"], ["yes"])
        assert sum(result["probabilities"].values()) == pytest.approx(1, abs=2e-6)
        assert set(result["conformal_set"]) <= {"no", "yes"} and result["conformal_kind"] == "split"
        assert result["shift"]["batch"] == 2
    assert by_path.status_code == 200 and [r["probabilities"] for r in by_path.json()["results"]] == [
        r["probabilities"] for r in results]  # fmt: skip
    assert too_many.status_code == 413 and "5 records" in too_many.json()["detail"]
    assert too_large.status_code == 413 and "--max-pixels" in too_large.json()["detail"]
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [line["http_status"] for line in lines] == [200, 200, 413, 413]
    manifest = "".join(f"{hashlib.sha256(files[n]).hexdigest()}  {n}\n" for n in sorted(files))
    assert lines[0]["input_sha256"] == hashlib.sha256(manifest.encode()).hexdigest() == lines[1]["input_sha256"]
    assert lines[0]["outputs"] == results
    assert verify_log(tmp_path / "audit.jsonl").lines == 4
