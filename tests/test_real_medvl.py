"""The ``medvl`` task on real published files (``tests/data/real/medvl/``, see its README): VQA-RAD as the OSF release
lays it out (``VQA_RAD Dataset Public.json`` + ``VQA_RAD Image Folder/``) and as MEVF ships it (``trainset.json`` /
``testset.json`` + ``images/``), pydicom's and nibabel's sample files, and PathVQA's pickles refused unopened.

VQA-RAD holds question answering only: the default run (H-LoRA beside its default baseline) must train the
comprehension plug-in alone, align on the questions, and report the QA metrics only.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

pytest.importorskip("monai")
pytest.importorskip("transformers")

import workbench  # noqa: E402
from workbench.cli import main  # noqa: E402

REAL = Path(__file__).parent / "data" / "real" / "medvl"
VQA_RAD = REAL / "vqa_rad"
PUBLIC_JSON = VQA_RAD / "VQA_RAD Dataset Public.json"
MEVF = REAL / "vqa_rad_mevf"
QA_METRICS = {"closed_accuracy", "open_recall"}
NOT_QA = ("report_f1", "ssim", "psnr_db")
#: Tiny settings: one epoch per stage on a few records, short answers.
TINY = {"epochs": 1, "batch_size": 8, "train_size": 8, "val_size": 4, "max_answer_words": 4, "quiet": True}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``workbench ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.parametrize("data", [VQA_RAD, PUBLIC_JSON, MEVF], ids=["osf-folder", "osf-json", "mevf-folder"])
def test_data_check_reads_each_real_vqa_rad_layout(capsys, data):
    code, out, _ = cli(capsys, "data", "check", "medvl", "--data", str(data))
    assert code == 0, out
    assert "train: 25 records, {'vqa-closed': 18, 'vqa-open': 7}" in out
    assert "test: 13 records, {'vqa-closed': 9, 'vqa-open': 4}" in out
    assert "images opened: 5" in out
    assert "absent: report, reconstruct, super-resolution, modality-conversion" in out
    assert out.strip().splitlines()[-1].startswith("ok: ")


def test_the_published_split_and_answers_are_read_as_shipped():
    from workbench.domains.medvl.readers import read_folder

    osf, mevf = read_folder(VQA_RAD), read_folder(MEVF)
    for split in ("train", "test"):
        assert [(s.id, s.question, s.answer, s.task) for s in osf[split]] == sorted(
            [(s.id, s.question, s.answer, s.task) for s in mevf[split]], key=lambda row: int(row[0])
        )
    records = {r["qid"]: r for r in json.loads(PUBLIC_JSON.read_text())}
    closed = next(s for s in osf["test"] if s.id == "1686")  # "Are the ventricles enlarged?" "Yes"
    assert records[1686]["answer"] == "Yes" and closed.answer == "yes" and closed.task == "vqa-closed"
    assert closed.image.name == "synpic38069.jpg" and closed.image.parent.name == "VQA_RAD Image Folder"


def test_default_run_on_vqa_rad_trains_the_comprehension_plugin_alone_and_reports_qa_metrics(tmp_path, caplog):
    out = tmp_path / "run"
    run = workbench.adapt("medvl", data=str(VQA_RAD), out=str(out), **TINY)
    metrics = run.metrics
    assert metrics["method"] == "hlora" and list(metrics["baselines"]) == ["hlora-lora"]
    for scores in (metrics["before"], metrics["after"], metrics["baselines"]["hlora-lora"]):
        assert QA_METRICS <= set(scores) and not any(k.startswith(NOT_QA) for k in scores), scores
        assert all(0 <= scores[k] <= 1 for k in QA_METRICS)
    assert "plugin_parameters_generation" not in metrics["after"]
    assert metrics["after"]["plugin_parameters_comprehension"] > 0
    assert metrics["skipped_records"] == {"skipped": 0, "seen": 38, "records": []}
    report = (out / "report.md").read_text()
    assert "closed_accuracy" in report and "open_recall" in report
    assert not any(name in report for name in NOT_QA), report
    assert (out / "scores.png").is_file() and not (out / "generated.png").exists()
    assert sorted(p.name for p in (out / "hlora").iterdir()) == ["comprehension.safetensors"]
    for name in ("hlora", "hlora-lora"):
        history = json.loads((out / "results" / f"{name}.json").read_text())["history"]
        assert [h["stage"] for h in history] == ["align", "embed", "adapt"]
    assert "stage 1 aligns the vision adapters on vqa-closed, vqa-open" in caplog.text
    assert "absent: report, reconstruct, super-resolution, modality-conversion" in caplog.text
    # the run's model reads back with the comprehension plug-in alone and answers
    model = workbench.Run.load(out).model
    assert model.kinds == ("comprehension",)
    assert not any(".generation." in name for name, _ in model.named_parameters())


def test_an_explicit_alignment_the_data_lack_is_refused(capsys, tmp_path):
    code, _, err = cli(capsys, "adapt", "--domain", "medvl", "--data", str(VQA_RAD), "--out", str(tmp_path / "r"),
                       "--alignment-tasks", "report,reconstruct", "--quiet")  # fmt: skip
    assert code == 2 and "the alignment sub-tasks ['reconstruct', 'report'] are not in the training data" in err
    assert not (tmp_path / "r").exists()


def corrupt_copy(tmp_path: Path) -> Path:
    """The real VQA-RAD cut with one of its five images cut to its first 300 bytes (a truncated download)."""
    copy = tmp_path / "vqa_rad"
    shutil.copytree(VQA_RAD, copy)
    image = copy / "VQA_RAD Image Folder" / "synpic47783.jpg"
    image.write_bytes(image.read_bytes()[:300])
    return copy


def test_a_corrupt_image_skips_its_records_and_is_counted(capsys, tmp_path):
    data = corrupt_copy(tmp_path)
    code, out, _ = cli(capsys, "data", "check", "medvl", "--data", str(data))
    assert code == 1
    assert "not ok: 7 of 38 record(s) skipped" in out and "synpic47783.jpg" in out
    run = workbench.adapt("medvl", "hlora", data=str(data), out=str(tmp_path / "run"), baselines=[], **TINY)
    skipped = run.metrics["skipped_records"]
    assert skipped["skipped"] == 7 and skipped["seen"] == 38
    assert all("synpic47783.jpg" in item["problem"] for item in skipped["records"])
    assert run.metrics["samples"]["test"] == 11  # 13 test questions, 2 of them on the broken image
    assert "## Skipped records" in (tmp_path / "run" / "report.md").read_text()


def test_a_corrupt_image_with_raise_exits_2_before_the_run_directory(capsys, tmp_path):
    data = corrupt_copy(tmp_path)
    out = tmp_path / "run"
    code, _, err = cli(capsys, "adapt", "--domain", "medvl", "--data", str(data), "--out", str(out),
                       "--on-bad-record", "raise", "--quiet")  # fmt: skip
    assert code == 2 and "synpic47783.jpg" in err and "cannot read" in err
    assert not out.exists()


class _Opens:
    """A pickle that creates ``marker`` when loaded: the proof that the reader never unpickles."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pathvqa_pickles_are_refused_never_loaded(capsys, tmp_path):
    marker = tmp_path / "loaded"
    qas = tmp_path / "pvqa" / "qas" / "train"
    qas.mkdir(parents=True)
    (qas / "train_qa.pkl").write_bytes(pickle.dumps([_Opens(marker)]))
    for data in (tmp_path / "pvqa", qas / "train_qa.pkl"):
        code, _, err = cli(capsys, "data", "check", "medvl", "--data", str(data))
        assert code == 2 and "never loads pickles" in err and "give --data a JSON copy" in err, err
    assert not marker.exists()


def test_real_dicom_and_nifti_samples_read_and_a_4d_volume_is_skipped(capsys, tmp_path):
    """LLaVA records whose images are the sample files pydicom and nibabel ship: CT and MR DICOM and a NIfTI volume
    read; nibabel's 4-D example and a volume whose middle slice is 21 × 26 px are bad records (skipped, named,
    counted)."""
    nibabel = pytest.importorskip("nibabel")
    from pydicom.data import get_testdata_file

    samples = Path(nibabel.__file__).parent / "tests" / "data"
    images = {
        "ct": get_testdata_file("CT_small.dcm"),
        "mr": get_testdata_file("MR_small.dcm"),
        "anat": samples / "anatomical.nii",
        "moved": samples / "reoriented_anat_moved.nii",
        "4d": samples / "example4d.nii.gz",
    }

    def record(name: str, answer: str) -> dict:
        question = {"from": "human", "value": "<image>\nis this image normal?"}
        return {"id": name, "image": str(images[name]), "conversations": [question, {"from": "gpt", "value": answer}]}

    folder = tmp_path / "scans"
    folder.mkdir()
    (folder / "train.json").write_text(json.dumps([record("ct", "yes"), record("mr", "no"), record("4d", "no")]))
    (folder / "test.json").write_text(json.dumps([record("anat", "yes"), record("moved", "no")]))
    # the sample files lie in the libraries' folders, outside the data folder
    code, out, _ = cli(capsys, "data", "check", "medvl", "--data", str(folder), "--allow-paths-outside")
    assert code == 1 and "not ok: 2 of 5 record(s) skipped" in out and "images opened: 3" in out
    assert "example4d.nii.gz is 4-D" in out
    assert "reoriented_anat_moved.nii is 26 × 21 px; expected at least 32 px on each side" in out


@pytest.mark.slow
def test_default_method_at_default_settings_on_the_real_vqa_rad_cut(tmp_path):
    run = workbench.adapt("medvl", data=str(VQA_RAD), out=str(tmp_path / "run"), quiet=True)
    assert QA_METRICS <= set(run.metrics["after"]) and "report_f1" not in run.metrics["after"]
    assert run.metrics["costs"]["hlora"]["epochs"] == 12  # 4 epochs in each of the three stages
