"""Where medvl reads from and how much: every image a record names must lie inside the data folder (``..``, absolute
paths and links out are refused with exit code 2 naming the record, whatever the bad-record policy, unless
``--allow-paths-outside``), and an image larger than ``--max-image-pixels`` (64 MP by default) is a bad record,
told by its header before a pixel is decoded (PNG, DICOM, NIfTI)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

pytest.importorskip("monai")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402
from workbench.domains.medvl.images import MAX_IMAGE_PIXELS, load_image  # noqa: E402
from workbench.domains.medvl.readers import read_json  # noqa: E402

from workbench.cli import main  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.paths import PathOutsideData  # noqa: E402

EMBEDDED = Path(__file__).resolve().parents[1] / "domains" / "medvl" / "embedded"
MEVF = Path(__file__).parent / "data" / "real" / "medvl" / "vqa_rad_mevf"
#: The smallest adapt that gets past reading (it never trains here: reading refuses first).
TINY_ADAPT = ("--epochs", "1", "--batch-size", "4", "--train-size", "4", "--val-size", "2", "--baselines", "",
              "--max-answer-words", "2", "--quiet")  # fmt: skip
SIDE = 10_000  # [px]: a 10000 × 10000 image, 100 MP, above the default 64 MP limit


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``workbench ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def one_line_error(err: str) -> str:
    """The single line a refused command prints (never a traceback)."""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def folder(tmp_path) -> Path:
    """A small LLaVA folder (train.json, test.json, images/) of the embedded set's VQA records: 12 train, 4 test."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    for name, count in (("train", 12), ("test", 4)):
        records = [r for r in json.loads((EMBEDDED / f"{name}.json").read_text()) if r["task"].startswith("vqa")]
        records = records[:count]
        for record in records:
            shutil.copy(EMBEDDED / record["image"], data / record["image"])
        (data / f"{name}.json").write_text(json.dumps(records))
    (tmp_path / "outside.png").write_bytes((EMBEDDED / "images" / "s0001_ct.png").read_bytes())
    return data


def set_image(data: Path, value: str, field: str = "image", index: int = 0) -> str:
    """Point train.json's record ``index`` at ``value``; returns the record's id."""
    records = json.loads((data / "train.json").read_text())
    records[index][field] = value
    (data / "train.json").write_text(json.dumps(records))
    return records[index]["id"]


def point_outside(data: Path, how: str) -> str:
    """Make train.json's first record name ``outside.png`` (beside the data folder) by ``how``; returns its id."""
    if how == "dotdot":
        return set_image(data, "../outside.png")
    if how == "absolute":
        return set_image(data, str(data.parent / "outside.png"))
    (data / "images" / "link.png").symlink_to(data.parent / "outside.png")
    return set_image(data, "images/link.png")


# --- confined paths ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_data_check_refuses_an_image_outside_the_data_folder_and_reads_it_when_allowed(capsys, folder, how):
    record = point_outside(folder, how)
    code, out, err = cli(capsys, "data", "check", "medvl", "--data", str(folder))
    assert code == 2, out + err
    message = one_line_error(err)
    named = "link.png" if how == "symlink" else "outside.png"
    assert f"train.json: record 0 ({record}), field 'image'" in message and named in message
    assert "outside the data folder" in message and "--allow-paths-outside" in message
    code, out, err = cli(capsys, "data", "check", "medvl", "--data", str(folder), "--allow-paths-outside")
    assert code == 0, out + err
    assert "train: 12 records" in out and out.strip().splitlines()[-1].startswith("ok: ")


@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_adapt_refuses_a_path_outside_whatever_the_bad_record_policy(capsys, folder, tmp_path, policy):
    """Never a skippable bad record: the run stops before its directory appears."""
    record = point_outside(folder, "dotdot")
    out = tmp_path / "run"
    code, _, err = cli(capsys, "adapt", "--domain", "medvl", "--data", str(folder), "--out", str(out),
                       "--on-bad-record", policy, *TINY_ADAPT)  # fmt: skip
    assert code == 2 and f"record 0 ({record}), field 'image'" in one_line_error(err) and "../outside.png" in err
    assert not out.exists()


def test_a_target_image_outside_is_refused(capsys, folder):
    records = json.loads((folder / "train.json").read_text())
    records[0].update(task="reconstruct", target_image="../outside.png")
    (folder / "train.json").write_text(json.dumps(records))
    code, _, err = cli(capsys, "data", "check", "medvl", "--data", str(folder))
    assert code == 2 and "field 'target_image'" in one_line_error(err) and "outside the data folder" in err


def test_vqa_rad_names_outside_and_links_out_in_mevfs_layout_are_refused(capsys, tmp_path):
    data = tmp_path / "mevf"
    shutil.copytree(MEVF, data)
    outside = tmp_path / "synpic00000.jpg"
    shutil.copy(data / "images" / "synpic29265.jpg", outside)
    records = json.loads((data / "trainset.json").read_text())
    records[1]["image_name"] = "../../synpic00000.jpg"  # images/../../ and ../../: both outside
    (data / "trainset.json").write_text(json.dumps(records))
    code, _, err = cli(capsys, "data", "check", "medvl", "--data", str(data))
    assert code == 2 and f"trainset.json: record 1 ({records[1]['qid']}), field 'image_name'" in one_line_error(err)
    # a name that resolves inside (images/../x) is fine; an image replaced by a link out is not
    records[1]["image_name"] = records[0]["image_name"]
    (data / "trainset.json").write_text(json.dumps(records))
    image = data / "images" / records[0]["image_name"]
    image.unlink()
    image.symlink_to(outside)
    code, _, err = cli(capsys, "data", "check", "medvl", "--data", str(data))
    assert code == 2 and "trainset.json: record 0 (" in one_line_error(err) and "outside the data folder" in err


def test_a_dicom_series_folder_with_a_file_linked_out_is_refused(tmp_path):
    from pydicom.data import get_testdata_file

    data = tmp_path / "data"
    series = data / "series"
    series.mkdir(parents=True)
    shutil.copy(get_testdata_file("CT_small.dcm"), series / "1.dcm")
    (series / "2.dcm").symlink_to(get_testdata_file("MR_small.dcm"))
    question = {"from": "human", "value": "<image>\nis this image normal?"}
    record = {"id": "ct", "image": "series", "conversations": [question, {"from": "gpt", "value": "yes"}]}
    (data / "train.json").write_text(json.dumps([record]))
    with pytest.raises(PathOutsideData, match=r"record 0 \(ct\), field 'image': names '.*2\.dcm'"):
        read_json(data / "train.json")
    assert read_json(data / "train.json", allow_outside=True)[0].image == series.resolve()


def test_pathvqa_images_above_the_json_folder_count_as_outside(tmp_path):
    pvqa = tmp_path / "pvqa"
    (pvqa / "images" / "train").mkdir(parents=True)
    (pvqa / "qas").mkdir()
    shutil.copy(EMBEDDED / "images" / "s0001_ct.png", pvqa / "images" / "train" / "train_0001.jpg")
    path = pvqa / "qas" / "train.json"
    path.write_text(json.dumps([{"image": "train_0001", "question": "is it?", "answer": "no"}]))
    with pytest.raises(PathOutsideData, match=r"train\.json: record 0, field 'image'.*--allow-paths-outside"):
        read_json(path)
    assert read_json(path, allow_outside=True)[0].image.name == "train_0001.jpg"
    assert read_json(pvqa / "qas" / "train.json", data_folder=pvqa)[0].image.name == "train_0001.jpg"


# --- image size limit --------------------------------------------------------------------------------------------


def big_png(path: Path, side: int = SIDE) -> Path:
    """A one-colour ``side`` × ``side`` PNG (compresses to ~100 KB for 10000²)."""
    Image.new("L", (side, side), 0).save(path)
    return path


def test_the_default_limit_is_64_megapixels_below_pils_own_guard():
    assert MAX_IMAGE_PIXELS == 64_000_000 < Image.MAX_IMAGE_PIXELS  # PIL warns above 89,478,485 px


def test_a_10000_square_png_is_a_bad_record_named_with_its_size_and_the_limit(capsys, folder, tmp_path):
    big_png(folder / "images" / "big.png")
    record = set_image(folder, "images/big.png")
    code, out, _ = cli(capsys, "data", "check", "medvl", "--data", str(folder))
    assert code == 1 and "not ok: 1 of 16 record(s) skipped" in out
    line = next(line for line in out.splitlines() if "big.png" in line)
    assert f"train.json record 0 ({record}): field 'image'" in line
    assert "10000 × 10000 px (100,000,000 pixels); expected at most 64,000,000 (--max-image-pixels)" in line
    run = tmp_path / "run"
    code, _, err = cli(capsys, "adapt", "--domain", "medvl", "--data", str(folder), "--out", str(run),
                       "--on-bad-record", "raise", *TINY_ADAPT)  # fmt: skip
    assert code == 2 and "big.png is 10000 × 10000 px" in one_line_error(err) and not run.exists()


def test_max_image_pixels_is_the_limit_a_run_applies(capsys, folder):
    code, out, _ = cli(capsys, "data", "check", "medvl", "--data", str(folder), "--max-image-pixels", "4000")
    assert code == 1 and "not ok: 16 of 16 record(s) skipped" in out  # the embedded images are 64 × 64 = 4096 px
    assert "64 × 64 px (4,096 pixels); expected at most 4,000" in out
    code, _, err = cli(capsys, "data", "check", "medvl", "--data", str(folder), "--max-image-pixels", "0")
    assert code == 2 and "--max-image-pixels must be at least 1024" in one_line_error(err)


def test_the_size_is_told_by_the_header_before_decoding(tmp_path):
    """Headers that claim 10000² pixels over files holding (almost) none: refused for their size, which only the
    header says, never 'cannot read'; and no DecompressionBombWarning from PIL."""
    import nibabel
    import pydicom
    from pydicom.data import get_testdata_file

    png = big_png(tmp_path / "big.png")
    cut = tmp_path / "cut.png"
    cut.write_bytes(png.read_bytes()[:64])  # the signature and IHDR, no pixel data
    dicom = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    dicom.Rows = dicom.Columns = SIDE
    dicom.save_as(tmp_path / "big.dcm")  # its pixel data still holds 128 × 128 pixels
    header = nibabel.Nifti1Header()
    header.set_data_shape((SIDE, SIDE, 2))
    with open(tmp_path / "big.nii", "wb") as f:
        header.write_to(f)  # the header alone: no voxel
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for name, shape in (("big.png", "10000 × 10000"), ("cut.png", "10000 × 10000"), ("big.dcm", "10000 × 10000"),
                            ("big.nii", "10000 × 10000 × 2")):  # fmt: skip
            with pytest.raises(UserError, match=rf"{name} is {shape} px \(.*expected at most 64,000,000"):
                load_image(tmp_path / name, source="train.json record 0 (q1)")
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]
