"""Runs that guard their own files (issue 42 items 1, 2, 6), through the command line.

A finished run is sealed (``seal.json``: sha256 and size of every file it wrote); ``evaluate``, ``predict`` and
``compare``'s report step verify before use and refuse a changed file in one line naming it (``--trust-modified``
proceeds and says so); ``workbench verify`` checks a run or a comparison. ``predict`` never writes into a run, never
replaces an earlier output without ``--overwrite``, checks its output before scoring, writes its CSV and record as a
pair (a failed write leaves the earlier pair, a crash never a mixed one) and fails when no input could be scored.
``evaluate`` reads its data with the run's own preprocessing, as ``predict`` does.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cli, one_line_error

pytest.importorskip("wfdb")

from workbench.domains.ecg.readers import EMBEDDED_PTBXL  # noqa: E402
from workbench.domains.ecg.task import PREPROCESSING, PtbXl  # noqa: E402

from workbench.core import seal  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.run import outputs  # noqa: E402

RECORDS = EMBEDDED_PTBXL / "records100" / "00000"
#: The smallest comparison: full fine-tuning of the features task, 2 folds of one seed, one epoch.
COMPARE = ["compare", "--domain", "features", "--methods", "full", "--folds", "2", "--seeds", "5", "--epochs", "1",
           "--train-size", "60", "--val-size", "20", "--batch-size", "20", "--pretrain-epochs", "20",
           "--quiet"]  # fmt: skip


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """``evaluate`` writes its record to ``evaluations/`` in the current folder: the test's own."""
    monkeypatch.chdir(tmp_path)


def run_cli(*args) -> subprocess.CompletedProcess:
    return cli(*[str(a) for a in args])


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (hidden lock files aside) with its bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.endswith((".lock", ".owner.json"))
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished (sealed) ptbxl run: the readout alone, one epoch on the embedded data."""
    out = tmp_path_factory.mktemp("sealed") / "R"
    result = run_cli("adapt", "--domain", "ptbxl", "--method", "readout", "--epochs", "1", "--baselines", "",
                     "--quiet", "--out", out)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def records(tmp_path) -> Path:
    folder = tmp_path / "records"
    folder.mkdir()
    for name in ("00001_lr", "00002_lr"):
        for suffix in (".hea", ".dat"):
            shutil.copy(RECORDS / f"{name}{suffix}", folder / f"{name}{suffix}")
    return folder


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(".lock", ".owner.json"))
    return to


def manifest_key_ids() -> set[str]:
    """The key_ids this machine trusts (the session's key: `conftest.pytest_configure`)."""
    from workbench.core import sealkeys

    return set(sealkeys.trusted_keys())


def predict(run: Path, records: Path, output: Path, *flags: str) -> subprocess.CompletedProcess:
    return run_cli("predict", "--run", run, "--input", records, "--output", output, *flags)


def test_a_finished_run_is_sealed_and_verifies(run):
    manifest = json.loads((run / "seal.json").read_text())
    assert manifest["format"] == seal.FORMAT and manifest["kind"] == "run"
    for name in ("adapter.safetensors", "adapter.json", "config.yaml", "metrics.json", "log.txt", "report.md"):
        entry = manifest["files"][name]
        assert entry["bytes"] == (run / name).stat().st_size
        assert entry["sha256"] == hashlib.sha256((run / name).read_bytes()).hexdigest()
    assert not any(name.startswith(".") or "/." in name for name in manifest["files"])  # no lock, no temporaries
    assert set(manifest["required"]) <= set(manifest["files"]) and manifest["key_id"] in manifest_key_ids()
    result = run_cli("verify", run)
    assert result.returncode == 0 and f"ok: {len(manifest['files'])} files verified" in result.stdout


def test_predict_into_the_run_is_refused_and_the_run_still_verifies(run, records, tmp_path):
    """The issue's repro: ``--output R/adapter.csv`` replaced the run's adapter.json with its record."""
    before = files_of(run)
    for output in (run / "adapter.csv", run / "results" / "p.csv", run / "new" / "p.csv"):
        one_line_error(predict(run, records, output), "inside the run folder", str(run))
    assert files_of(run) == before and not (run / "new").exists()
    verified = run_cli("verify", run)
    assert verified.returncode == 0 and "files verified" in verified.stdout, verified.stderr


def test_an_earlier_output_is_replaced_only_with_overwrite(run, records, tmp_path):
    output = tmp_path / "out" / "p.csv"
    assert predict(run, records, output).returncode == 0
    pair = files_of(output.parent)
    assert set(pair) == {"p.csv", "p.json"}
    record = json.loads(pair["p.json"])
    assert record["sha256"]["csv"] == hashlib.sha256(pair["p.csv"]).hexdigest()
    assert record["run_seal"]["status"] == "verified"
    one_line_error(predict(run, records, output), "p.csv and p.json already exist", "--overwrite")
    assert files_of(output.parent) == pair
    (output.parent / "q.json").write_text("someone else's record")  # a record alone counts too
    one_line_error(predict(run, records, output.parent / "q.csv"), "q.json already exists", "--overwrite")
    assert not (output.parent / "q.csv").exists() and (output.parent / "q.json").read_text() == "someone else's record"
    replaced = predict(run, records, output, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    new = json.loads(output.with_suffix(".json").read_text())
    assert new["created"] >= record["created"]
    assert new["sha256"]["csv"] == hashlib.sha256(output.read_bytes()).hexdigest()
    assert {p.name for p in output.parent.iterdir() if not p.name.endswith((".lock", ".owner.json"))} == {
        "p.csv", "p.json", "q.json"
    }  # fmt: skip


def test_a_failed_write_leaves_the_earlier_pair_and_nothing_new(run, records, tmp_path, monkeypatch):
    """A full disk while the record is written (the second file, half written), and a record that cannot be renamed
    into place: the earlier CSV and record stay as they were, no new or temporary file appears; exit 2, one line."""
    output = tmp_path / "out" / "p.csv"
    assert predict(run, records, output).returncode == 0
    pair = files_of(output.parent)
    write = outputs._write_temporary
    calls = []

    def full_disk_at_the_second_file(path: Path, content: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            with open(path, "xb") as handle:
                handle.write(content[: len(content) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, content)

    monkeypatch.setattr(outputs, "_write_temporary", full_disk_at_the_second_file)
    one_line_error(predict(run, records, output, "--overwrite"), "no space left", "nothing was replaced")
    assert len(calls) == 2 and files_of(output.parent) == pair
    calls.clear()
    one_line_error(predict(run, records, output.parent / "fresh.csv"), "no space left")
    assert files_of(output.parent) == pair  # neither fresh.csv nor fresh.json
    monkeypatch.setattr(outputs, "_write_temporary", write)

    replace = os.replace

    def record_cannot_be_renamed(source, target, *args, **kwargs):
        if Path(target) == output.with_suffix(".json") and ".tmp" in str(source):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", record_cannot_be_renamed)
    one_line_error(predict(run, records, output, "--overwrite"), "nothing was replaced")
    monkeypatch.setattr(os, "replace", replace)
    assert files_of(output.parent) == pair


@pytest.mark.parametrize("crash_at", ["replace 1", "replace 2", "replace 3", "replace 4", "after the renames"])
def test_a_crash_during_the_write_never_leaves_a_mixed_pair(tmp_path, crash_at):
    """kill -9 at each step of `write_pair` (before each of its renames, and after them): the visible files are never
    a CSV beside the record of the other write, and the next write's `recover_pair` restores the earlier pair (or
    keeps the new one once its record was in place) and leaves no hidden file."""
    csv, record = tmp_path / "p.csv", tmp_path / "p.json"
    outputs.write_pair(csv, b"old csv\n", record, b'{"old": 1}\n')
    code = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from workbench.run import outputs
        crash_at, replace, count = {crash_at!r}, os.replace, []
        def counted(source, target):
            count.append(1)
            if crash_at == f"replace {{len(count)}}":
                os._exit(9)
            replace(source, target)
        os.replace = counted
        if crash_at == "after the renames":
            outputs._fsync_folder = lambda folder: os._exit(9)
        outputs.write_pair(Path(sys.argv[1]), b"new csv\\n", Path(sys.argv[2]), b'{{"new": 1}}\\n')
    """)
    crashed = subprocess.run([sys.executable, "-c", code, str(csv), str(record)], capture_output=True, text=True)
    assert crashed.returncode == 9, crashed.stderr
    visible = (csv.read_bytes() if csv.exists() else None, record.read_bytes() if record.exists() else None)
    assert visible not in [(b"new csv\n", b'{"old": 1}\n'), (b"old csv\n", b'{"new": 1}\n')]  # never mixed
    outputs.recover_pair(csv, record)
    committed = crash_at == "after the renames"
    expected = (b"new csv\n", b'{"new": 1}\n') if committed else (b"old csv\n", b'{"old": 1}\n')
    assert (csv.read_bytes(), record.read_bytes()) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.json"]


def test_a_changed_run_file_is_refused_naming_it_unless_trusted(run, records, tmp_path):
    changed = copy_run(run, tmp_path / "R")
    weights = changed / "adapter.safetensors"
    content = bytearray(weights.read_bytes())
    content[-3] ^= 0x01  # one bit of the last tensor's data
    weights.write_bytes(bytes(content))
    for command in (["evaluate", changed], ["predict", "--run", changed, "--input", records, "--output",
                                               tmp_path / "p.csv"]):  # fmt: skip
        one_line_error(run_cli(*command), f"{weights}: sha256 differs", "seal.json", "--trust-modified")
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.json").exists()
    verified = run_cli("verify", changed)
    assert verified.returncode == 2 and str(weights) in verified.stderr and "ok:" not in verified.stdout

    trusted = run_cli("evaluate", changed, "--trust-modified")
    assert trusted.returncode == 0, trusted.stderr
    first = trusted.stdout.splitlines()[0]
    assert "--trust-modified" in first and str(weights) in first and "macro_auroc" in trusted.stdout
    predicted = predict(changed, records, tmp_path / "p.csv", "--trust-modified")
    assert predicted.returncode == 0, predicted.stderr
    recorded = json.loads((tmp_path / "p.json").read_text())["run_seal"]
    assert "--trust-modified" in recorded["status"] and str(weights) in recorded["problems"][0]

    edited = copy_run(run, tmp_path / "thresholds")  # the other case: thresholds edited in adapter.json
    adapter = json.loads((edited / "adapter.json").read_text())
    adapter["task_state"]["thresholds"] = [0.99] * len(adapter["task_state"]["thresholds"])
    (edited / "adapter.json").write_text(json.dumps(adapter, indent=2) + "\n")
    one_line_error(run_cli("evaluate", "--run", edited), f"{edited / 'adapter.json'}:", "--trust-modified")


def test_a_run_without_a_seal_is_refused_unless_trusted(run, records, tmp_path):
    """A deleted seal (or a run written before runs were sealed) is refused by evaluate, predict and serve's loader
    (issue 53): nothing proves its files; ``--trust-modified`` uses it and records why."""
    from workbench.clinical.predictor import ClinicalPredictor

    older = copy_run(run, tmp_path / "older")
    (older / "seal.json").unlink()
    missing = f"{older / 'seal.json'}: missing"
    one_line_error(run_cli("evaluate", older, "--out", tmp_path), missing, "--trust-modified")
    one_line_error(predict(older, records, tmp_path / "p.csv"), missing, "--trust-modified")
    assert not (tmp_path / "p.csv").exists()
    with pytest.raises(UserError, match="seal.json: missing"):
        ClinicalPredictor.load(older)
    served = ClinicalPredictor.load(older, trust_modified=True)
    assert missing in served.sealed["problems"][0] and "--trust-modified" in served.sealed["status"]
    assert predict(older, records, tmp_path / "p.csv", "--trust-modified").returncode == 0
    recorded = json.loads((tmp_path / "p.json").read_text())["run_seal"]
    assert "--trust-modified" in recorded["status"] and missing in recorded["problems"][0]
    one_line_error(predict(older, records, older / "adapter.csv"), "inside the run folder")  # sealed or not
    unverifiable = run_cli("verify", older)
    assert unverifiable.returncode == 2 and "cannot be verified" in unverifiable.stderr
    one_line_error(run_cli("verify", tmp_path / "records"), "not a finished run or comparison")


def test_an_emptied_or_forged_seal_is_refused_by_predict_and_serve(run, records, tmp_path):
    """The probe's repro: emptying ``files`` let a tampered adapter through ("verified, 0 files")."""
    from workbench.clinical.predictor import ClinicalPredictor

    changed = copy_run(run, tmp_path / "R")
    content = json.loads((changed / "seal.json").read_text())
    (changed / "seal.json").write_text(json.dumps({**content, "files": {}}))
    one_line_error(predict(changed, records, tmp_path / "p.csv"), "signature does not hold")
    with pytest.raises(UserError, match="signature does not hold"):
        ClinicalPredictor.load(changed)
    (changed / "seal.json").write_text(json.dumps({**content, "format": "workbench-seal/1"}))
    one_line_error(predict(changed, records, tmp_path / "p.csv"), "unkeyed seal written before seals were signed")
    assert not (tmp_path / "p.csv").exists()


def test_the_output_is_checked_before_anything_is_scored(run, records, tmp_path, monkeypatch):
    def scored(*args, **kwargs):
        raise AssertionError("a record was scored before the output was checked")

    monkeypatch.setattr(PtbXl, "predict_folder", scored)
    (tmp_path / "a-folder.csv").mkdir()
    (tmp_path / "afile").write_text("a file")
    cases = [
        (tmp_path / "a-folder.csv", "is a folder"),
        (tmp_path / "afile" / "p.csv", "is a file, not a folder"),
        (tmp_path / "p.txt", "must be a .csv file"),
    ]
    for output, message in cases:
        one_line_error(predict(run, records, output), message)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    one_line_error(predict(run, records, tmp_path / "p.csv"), "MiB free", "choose another --output")
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_refused_before_scoring(run, records, tmp_path, monkeypatch):
    monkeypatch.setattr(PtbXl, "predict_folder", lambda *a, **k: pytest.fail("scored"))
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        one_line_error(predict(run, records, folder / "p.csv"), "cannot write in")
    finally:
        folder.chmod(0o755)


def test_no_input_scored_is_an_error_and_writes_nothing(run, records, tmp_path):
    for data in records.glob("*.dat"):
        data.write_bytes(data.read_bytes()[:100])  # every record truncated
    one_line_error(predict(run, records, tmp_path / "p.csv"), "no input could be scored", "all 2 failed", "00001_lr")
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.json").exists()


def test_evaluate_reads_its_data_with_the_runs_preprocessing_as_predict_does(run, records, tmp_path, monkeypatch):
    """A run made with another band-pass (its task state says so, and its seal covers it): ``evaluate`` reads the
    data with it, as ``predict`` reads its records: one code path (`Task.use_run_state`)."""
    from workbench.domains.ecg import task as ecg_task

    other = copy_run(run, tmp_path / "other")
    adapter = json.loads((other / "adapter.json").read_text())
    adapter["task_state"]["preprocessing"].update(bandpass_hz=[0.5, 40.0], filter_order=2)
    (other / "adapter.json").write_text(json.dumps(adapter, indent=2) + "\n")
    seal.seal(other, "run")
    expected = ecg_task._preprocessing(adapter["task_state"]["preprocessing"])
    assert expected != PREPROCESSING
    seen = {"evaluate": [], "predict": []}
    read_embedded, read_record = ecg_task.read_embedded, ecg_task.read_record

    def embedded(settings=None, **options):
        seen["evaluate"].append(settings)
        return read_embedded(settings, **options)

    def record(header, settings=None, **options):
        seen["predict"].append(settings)
        return read_record(header, settings, **options)

    monkeypatch.setattr(ecg_task, "read_embedded", embedded)
    monkeypatch.setattr(ecg_task, "read_record", record)
    assert run_cli("evaluate", other).returncode == 0
    assert predict(other, records, tmp_path / "p.csv").returncode == 0
    assert seen["evaluate"] == [expected] and seen["predict"] == [expected, expected]


def test_a_changed_cell_record_is_refused_by_verify_and_by_compare(tmp_path):
    """The issue's repro: accuracy 123.0 edited into a cell's cell.json was used in the report."""
    out = tmp_path / "cmp"
    first = run_cli(*COMPARE, "--out", out)
    assert first.returncode == 0, first.stderr
    cell = out / "cells" / "full" / "fold0-seed5"
    assert "cell.json" in json.loads((cell / "seal.json").read_text())["files"]
    assert {"spec.json", "comparison.json", "report.md"} <= set(json.loads((out / "seal.json").read_text())["files"])
    verified = run_cli("verify", out)
    assert verified.returncode == 0 and "files verified" in verified.stdout, verified.stderr

    record = json.loads((cell / "cell.json").read_text())
    record["metrics"]["accuracy"] = 123.0
    (cell / "cell.json").write_text(json.dumps(record, indent=2) + "\n")
    summary = (out / "comparison.json").read_bytes()
    refused = run_cli("verify", out)
    assert refused.returncode == 2 and f"{cell / 'cell.json'}:" in refused.stderr and "ok:" not in refused.stdout
    one_line_error(run_cli(*COMPARE, "--out", out), f"{cell / 'cell.json'}:", "remove")
    assert (out / "comparison.json").read_bytes() == summary and "123" not in (out / "report.md").read_text()
