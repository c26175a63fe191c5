"""The served model's request checks without a server: record and image extents told by headers before decoding
(`workbench.serve.limits`), uploaded names, intake paths and the input hash (`workbench.serve.uploads`), and bearer
tokens (`workbench.serve.auth`)."""

from __future__ import annotations

import hashlib
import io
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from workbench.core.errors import UserError
from workbench.serve.auth import parse_tokens
from workbench.serve.limits import Limits, check_upload, too_large
from workbench.serve.uploads import Refused, RequestFolder, input_sha256, intake_files, safe_name

LIMITS = Limits(max_record_seconds=3600, max_pixels=1_000_000)


def _edf(path: Path, records: int, seconds: float) -> Path:
    """A 256-byte EDF main header declaring ``records`` data records of ``seconds`` each (the fields the check
    reads; the rest blank)."""
    header = bytearray(b" " * 256)
    header[0:8] = b"0".ljust(8)
    header[236:244] = str(records).ljust(8).encode()
    header[244:252] = f"{seconds:g}".ljust(8).encode()
    header[252:256] = b"1".ljust(4)
    path.write_bytes(bytes(header))
    return path


def test_signal_durations_are_read_from_the_headers(tmp_path):
    short = tmp_path / "a.hea"
    short.write_text("# a comment first\na 12 500/1(0) 5000 10:00:00\na.dat 16 1000 16 0 0 0 0 I\n")
    assert too_large(short, LIMITS) is None  # 10 s
    long = tmp_path / "b.hea"
    long.write_text("b 12 100 720000\n")
    assert too_large(long, LIMITS) == ("b.hea: a record of 7200 s, above this server's limit of 3600 s "
                                       "(--max-record-s); split the record")  # fmt: skip
    assert too_large(_edf(tmp_path / "c.edf", 360, 10.0), LIMITS) is None  # 3600 s: at the limit
    assert "a record of 3630 s" in too_large(_edf(tmp_path / "d.edf", 121, 30.0), LIMITS)
    segmented = tmp_path / "e.hea"
    segmented.write_text("e/2 12 100 99999999\n")  # a multi-segment record: its duration cannot be bounded
    assert check_upload(segmented, LIMITS) == (422, "e.hea: a multi-segment record (record line 'name/segments'): "
                                               "this server cannot bound its duration from the header; send a "
                                               "single-segment record")  # fmt: skip


def test_image_pixels_are_read_from_the_headers_before_decoding(tmp_path):
    small = tmp_path / "small.png"
    Image.new("L", (100, 100)).save(small)
    assert too_large(small, LIMITS) is None
    jpeg = io.BytesIO()
    Image.new("RGB", (16, 16)).save(jpeg, format="JPEG")
    data = bytearray(jpeg.getvalue())
    sof = data.index(b"\xff\xc0")  # the frame header: length (2), precision (1), height (2), width (2)
    data[sof + 5 : sof + 9] = (20_000).to_bytes(2, "big") + (20_000).to_bytes(2, "big")
    (tmp_path / "huge.jpg").write_bytes(bytes(data))
    assert "an image of 400,000,000 pixels" in too_large(tmp_path / "huge.jpg", LIMITS)
    pydicom = pytest.importorskip("pydicom")
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = SecondaryCaptureImageStorage, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = pydicom.Dataset()
    dataset.file_meta = meta
    dataset.Rows, dataset.Columns, dataset.NumberOfFrames = 1000, 1000, 3  # no pixel data: never read
    dataset.save_as(tmp_path / "volume.dcm", enforce_file_format=True)
    assert "an image of 3,000,000 pixels" in too_large(tmp_path / "volume.dcm", LIMITS)
    (tmp_path / "noise.png").write_bytes(b"not a png at all")
    assert too_large(tmp_path / "noise.png", LIMITS) is None  # the reader says what is wrong with it


def test_uploaded_names_are_reduced_to_plain_names():
    assert safe_name("../../00001_lr.hea") == "00001_lr.hea" and safe_name("C:\\x\\rec.edf") == "rec.edf"
    for bad in (".hidden", "", None, "a b.hea", "x" * 129, "../"):
        with pytest.raises(Refused) as refused:
            safe_name(bad)
        assert refused.value.status == 400


def test_the_input_hash_is_what_sha256sum_prints_of_the_manifest(tmp_path):
    files = {"b.dat": b"\x00\x01" * 50, "a.hea": b"a 12 100 50\n"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    manifest = subprocess.run(["sha256sum", "a.hea", "b.dat"], cwd=tmp_path, capture_output=True, check=True).stdout
    folder = RequestFolder(tmp_path / "request", max_bytes=1000, max_files=4)
    folder.folder.mkdir()
    for name in ("b.dat", "a.hea"):  # the order sent does not matter
        folder.add(name, io.BytesIO(files[name]))
    assert folder.sha256 == hashlib.sha256(manifest).hexdigest() == input_sha256(folder.digests)
    with pytest.raises(Refused, match="given twice"):
        folder.add("a.hea", io.BytesIO(b""))
    with pytest.raises(Refused, match="limit of") as refused:
        folder.add("c.bin", io.BytesIO(b"x" * 1000))
    assert refused.value.status == 413


def test_intake_paths_take_a_record_s_files_and_refuse_ways_out(tmp_path):
    intake = tmp_path / "intake"
    (intake / "ward").mkdir(parents=True)
    for name in ("r1.hea", "r1.dat", "r1.atr", "r2.hea", "r2.dat", ".r1.hea.swp"):
        (intake / "ward" / name).write_bytes(b"x")
    (tmp_path / "secret.hea").write_bytes(b"x")
    (intake / "ward" / "link.hea").symlink_to(tmp_path / "secret.hea")
    assert [p.name for p in intake_files(intake, "ward/r1.hea")] == ["r1.atr", "r1.dat", "r1.hea"]
    assert [p.name for p in intake_files(intake, "ward")] == ["r1.atr", "r1.dat", "r1.hea", "r2.dat", "r2.hea"]
    for path, status in (("../secret.hea", 400), ("ward/link.hea", 400), (str(tmp_path / "secret.hea"), 400),
                         ("ward/r3.hea", 404), ("", 400), (7, 400)):  # fmt: skip
        with pytest.raises(Refused) as refused:
            intake_files(intake, path)
        assert refused.value.status == status, path


def test_tokens_name_their_caller_and_weak_or_repeated_ones_are_refused():
    tokens = parse_tokens("# callers\nward-7 " + "a" * 20 + "\nlab.b " + "b" * 20 + "  # second\n", "tokens.txt")
    assert tokens.caller("Bearer " + "b" * 20) == "lab.b" and tokens.caller("bearer " + "a" * 20) == "ward-7"
    for header in (None, "", "Bearer", "Bearer " + "a" * 19, "Basic " + "a" * 20, "a" * 20):
        assert tokens.caller(header) is None, header
    assert parse_tokens("x " + "c" * 16 + ";y " + "d" * 16, "$VAR").caller("Bearer " + "d" * 16) == "y"
    for text, message in (("ward-7 short", "at least 16"), ("a " + "x" * 16 + "\na " + "y" * 16, "given twice"),
                          ("a " + "x" * 16 + "\nb " + "x" * 16, "the same token"), ("only-one-word", "two words"),
                          ("", "no 'caller_id token' pair"), ("bad/id " + "x" * 16, "caller id")):  # fmt: skip
        with pytest.raises(UserError, match=message):
            parse_tokens(text, "tokens.txt")


def test_questions_files_are_bounded_by_their_size_and_count_as_the_flags_set(tmp_path, monkeypatch, capsys):
    """``--max-json-mb`` and ``--max-questions`` reach the served limits; a JSON upload past either is refused by its
    size before parsing, or by its count, naming the flag."""
    import json

    import workbench.serve.server as server
    from workbench.cli import main

    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps([{"question": "is there an effusion?", "image_name": "a.png"}] * 5))
    assert check_upload(questions, Limits(max_questions=5)) is None
    assert check_upload(questions, Limits(max_questions=4)) == (413, "questions.json: 5 records, above this server's "
                                                                "limit of 4 questions per request (--max-questions); "
                                                                "split the questions file")  # fmt: skip
    size = questions.stat().st_size
    status, message = check_upload(questions, Limits(max_json_bytes=size - 1))
    assert status == 413 and f"a JSON file of {size:,} bytes" in message and "(--max-json-mb)" in message
    given = {}
    monkeypatch.setattr(server, "serve", lambda run, **options: given.update(options))  # where the limits arrive
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--run", str(tmp_path), "--max-json-mb", "0.25", "--max-questions", "8"])
    assert exit_.value.code == 0
    assert (given["limits"].max_json_bytes, given["limits"].max_questions) == (1 << 18, 8)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--run", str(tmp_path), "--max-questions", "0"])
    assert exit_.value.code == 2 and "--max-questions 0: expected a positive number" in capsys.readouterr().err
