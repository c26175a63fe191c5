"""Seals that prove intent, not only accident (issue 53, item 2): signed, complete, verified by every reader.

A seal (`workbench.core.seal`, format 2) is signed with an ed25519 key kept outside every run folder
(`workbench.core.sealkeys`); it must list the files its kind always holds; a reader refuses a missing, unkeyed,
re-signed or incomplete seal and any changed or added file, unless ``--trust-modified`` (which records the problems).
``evaluate`` writes its record outside the run; a run killed between ``metrics.json`` and ``seal.json`` is not
complete, and ``--resume`` seals it. The session's key is a temporary one (``conftest.seal_key_of_the_session``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import cli, one_line_error
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from workbench.comparison.cells import read_record
from workbench.comparison.design import Cell
from workbench.core import seal, sealkeys
from workbench.core.errors import UserError
from workbench.core.finished import Run

#: The smallest run: full fine-tuning of the features task, one epoch, no baselines.
ADAPT = ["adapt", "--domain", "features", "--method", "full", "--epochs", "1", "--train-size", "60", "--val-size",
         "20", "--batch-size", "20", "--baselines", "", "--quiet"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("keyed") / "R"
    result = cli(*ADAPT, "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(".lock", ".owner.json"))
    return to


def manifest(folder: Path) -> dict:
    return json.loads((folder / "seal.json").read_text())


def signed(content: dict, key: Ed25519PrivateKey) -> dict:
    """``content`` signed by ``key`` as `workbench.core.seal.seal` signs (what an attacker with their own key does)."""
    raw = sealkeys.raw_public(key.public_key())
    content = {**content, "key_id": sealkeys.key_id(raw), "public_key": sealkeys.encode(raw)}
    return {**content, "signature": sealkeys.encode(key.sign(seal.canonical(content)))}


def rewrite(folder: Path, content: dict) -> None:
    (folder / "seal.json").write_text(json.dumps(content, indent=2) + "\n")


def refused(folder: Path, *names: str) -> str:
    """``workbench evaluate`` and `Run.load` refuse ``folder``, naming ``names``; ``verify`` exits 2."""
    line = one_line_error(cli("evaluate", str(folder), "--out", str(folder.parent / "e.json")), *names,
                          "--trust-modified")  # fmt: skip
    with pytest.raises(UserError, match="--trust-modified"):
        Run.load(folder)
    assert cli("verify", str(folder)).returncode == 2
    assert not (folder.parent / "e.json").exists()
    return line


def test_a_run_is_signed_by_the_sessions_key_and_verify_names_it(run):
    content = manifest(run)
    assert content["format"] == seal.FORMAT == "workbench-seal/2" and content["kind"] == "run"
    assert set(content["required"]) == set(seal.REQUIRED["run"]) <= set(content["files"])
    raw = base64.b64decode(content["public_key"])
    assert content["key_id"] == hashlib.sha256(raw).hexdigest()[:16]
    assert sealkeys.signature_holds(raw, base64.b64decode(content["signature"]), seal.canonical(content))
    key = sealkeys.key_path()
    assert key.is_file() and oct(key.stat().st_mode & 0o777) == "0o600" and seal.run_folder_above(key) is None
    assert oct(key.parent.stat().st_mode & 0o777) == "0o700"
    result = cli("verify", str(run))
    assert result.returncode == 0 and f"verified: {run} (run, key {content['key_id']}" in result.stdout


def test_an_entry_deleted_from_files_is_refused(run, tmp_path):
    changed = copy_run(run, tmp_path / "R")
    content = manifest(changed)
    del content["files"]["adapter.safetensors"]
    rewrite(changed, content)
    (changed / "adapter.safetensors").write_bytes(b"tampered")
    refused(changed, "signature does not hold")
    rewrite(changed, signed(content, sealkeys.signing_key()))  # even signed by the trusted key: a required file
    line = refused(changed, str(changed / "adapter.safetensors"))
    assert "not listed" in line and "though every run holds it" in line


def test_emptied_files_are_refused(run, tmp_path):
    changed = copy_run(run, tmp_path / "R")
    content = {**manifest(changed), "files": {}}
    rewrite(changed, content)
    refused(changed, "signature does not hold")
    rewrite(changed, signed(content, sealkeys.signing_key()))
    refused(changed, "not listed")


def test_a_seal_recomputed_without_the_key_is_refused_naming_its_key(run, tmp_path):
    """An attacker re-hashes a changed adapter: with a fresh key of their own (format 2), or in the unkeyed format 1."""
    changed = copy_run(run, tmp_path / "R")
    (changed / "adapter.json").write_text((changed / "adapter.json").read_text().replace("full", "full "))
    seal_v2 = manifest(changed)
    seal_v2["files"]["adapter.json"] = {"sha256": seal.sha256_file(changed / "adapter.json"),
                                        "bytes": (changed / "adapter.json").stat().st_size}  # fmt: skip
    forged = signed(seal_v2, Ed25519PrivateKey.generate())
    rewrite(changed, forged)
    line = refused(changed, f"signed by key {forged['key_id']}, which is not trusted here", "trusted-seal-keys")
    assert forged["public_key"] in line  # the line that would trust it, if one chose to
    unkeyed = {key: forged[key] for key in ("kind", "sealed", "workbench_version", "files")}
    rewrite(changed, {"format": "workbench-seal/1", **unkeyed})
    refused(changed, "an unkeyed seal written before seals were signed")


def test_a_deleted_seal_is_refused_by_evaluate_run_load_and_a_teacher(run, tmp_path):
    from workbench.adaptation.distill import _verified_teacher

    unsealed = copy_run(run, tmp_path / "R")
    (unsealed / "seal.json").unlink()
    refused(unsealed, f"{unsealed / 'seal.json'}: missing")
    with pytest.raises(UserError, match=r"seal\.json: missing.*a --teacher is used only when its run verifies"):
        _verified_teacher(str(unsealed))
    result = cli("verify", str(unsealed))
    assert "not complete" in result.stderr and "--resume" in result.stderr


def test_trust_modified_goes_on_and_records_the_problems(run, tmp_path):
    changed = copy_run(run, tmp_path / "R")
    (changed / "seal.json").unlink()
    (changed / "added.txt").write_text("not the run's")
    result = cli("evaluate", str(changed), "--trust-modified", "--out", str(tmp_path / "e.json"))
    assert result.returncode == 0, result.stderr
    assert "--trust-modified" in result.stdout.splitlines()[0]
    recorded = json.loads((tmp_path / "e.json").read_text())
    assert recorded["run_seal"]["status"] == "modified, used with --trust-modified"
    assert any("seal.json: missing" in problem for problem in recorded["run_seal"]["problems"])
    loaded = Run.load(changed, trust_modified=True)
    assert loaded.sealed["problems"] == recorded["run_seal"]["problems"] and loaded.model is not None


def test_a_second_key_verifies_once_it_is_trusted(run, tmp_path, monkeypatch):
    """Another machine's key (its own configuration folder) sealed the run: refused here until its public key is a
    line of this machine's trusted-seal-keys; the private key never travels."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "here"))
    monkeypatch.setenv(sealkeys.KEY_ENV, str(tmp_path / "here" / "workbench" / "seal-key.pem"))
    other = copy_run(run, tmp_path / "R")
    with sealkeys.key_in_use(tmp_path / "other-site" / "key.pem"):
        seal.seal(other, "run")
    theirs = manifest(other)
    assert sealkeys.key_id(base64.b64decode(theirs["public_key"])) == theirs["key_id"]
    refused(other, f"signed by key {theirs['key_id']}")
    trusted = sealkeys.trusted_path()
    trusted.parent.mkdir(parents=True, exist_ok=True)
    trusted.write_text(f"# shared by the other site\nother-site {theirs['public_key']}  # their public key\n")
    assert seal.check_run(other) == {"status": "verified", "files": len(theirs["files"]), "key_id": theirs["key_id"]}
    trusted.write_text("other-site not-base64!\n")
    with pytest.raises(UserError, match="trusted-seal-keys line 1"):
        seal.check_run(other)


def test_a_key_inside_a_run_folder_or_unreadable_is_refused(run, tmp_path, monkeypatch):
    monkeypatch.setenv(sealkeys.KEY_ENV, str(run / "keys" / "seal-key.pem"))
    one_line_error(cli("verify", str(run)), "inside the run folder", "--seal-key")
    assert not (run / "keys").exists()
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    one_line_error(cli("verify", str(run), "--seal-key", str(bad)), f"seal key {bad}", "not an unencrypted PEM")
    assert os.environ[sealkeys.KEY_ENV] == str(run / "keys" / "seal-key.pem")  # --seal-key lasts one command


def test_evaluate_never_writes_inside_a_run(run, tmp_path, monkeypatch):
    """The probe's repro: ``--data R/seal.json`` wrote ``R/evaluations/seal.json`` and bricked the run."""
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and not p.name.startswith(".")}
    monkeypatch.chdir(tmp_path)
    cli("evaluate", str(run), "--data", str(run / "seal.json"))  # whatever it says of those data
    for out in (run / "evaluations", run / "results" / "e.json"):
        one_line_error(cli("evaluate", str(run), "--out", str(out)), "inside the run folder", "--out")
    done = cli("evaluate", str(run))
    assert done.returncode == 0, done.stderr
    record = tmp_path / "evaluations" / "R-default-data.json"
    assert f"record written to {Path('evaluations') / 'R-default-data.json'}" in done.stdout
    assert json.loads(record.read_text())["run_seal"]["status"] == "verified"
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and not p.name.startswith(".")}
    assert after == before and cli("verify", str(run)).returncode == 0


def test_a_run_killed_between_metrics_and_seal_is_incomplete_and_resume_seals_it(tmp_path, monkeypatch):
    from workbench.run import adapting

    out = tmp_path / "R"

    def killed(folder, kind, **more):
        raise KeyboardInterrupt  # the process dies after metrics.json, before seal.json

    monkeypatch.setattr(adapting, "seal", killed)
    assert cli(*ADAPT, "--out", str(out)).returncode == 130
    assert (out / "metrics.json").is_file() and not (out / "seal.json").exists()
    monkeypatch.undo()
    result = cli("verify", str(out))
    assert result.returncode == 2 and "not complete" in result.stderr
    with pytest.raises(UserError, match="seal.json: missing"):
        Run.load(out)
    resumed = cli(*ADAPT, "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert manifest(out)["kind"] == "run" and cli("verify", str(out)).returncode == 0
    (out / "metrics.json").write_text((out / "metrics.json").read_text().replace('"seed": 0', '"seed": 1'))
    one_line_error(cli(*ADAPT, "--out", str(out), "--resume"), "metrics.json", "not resumed over files that differ")


def test_a_cell_record_out_of_range_is_refused_naming_file_and_field(tmp_path):
    """Even under a valid seal, a cell's metrics are range-checked when read back (`workbench.core.metrics`)."""
    cell = Cell("full", 0, 5, {"test": ["a"]})
    folder = tmp_path / "cells" / cell.name
    folder.mkdir(parents=True)
    record = {"method": "full", "fold": 0, "seed": 5, "split": {"test": ["a"]}, "metrics": {"accuracy": 0.5}}
    (folder / "cell.json").write_text(json.dumps(record))
    assert read_record(tmp_path, cell)["metrics"] == {"accuracy": 0.5}
    for metrics, expected in (({"accuracy": 123.0}, "metrics.accuracy is 123.0, expected a number in [0, 1]"),
                              ({"mse": -1.0}, "metrics.mse is -1.0, expected a number >= 0"),
                              ({"r2": float("inf")}, "metrics.r2 is inf, expected a finite number")):  # fmt: skip
        (folder / "cell.json").write_text(json.dumps({**record, "metrics": metrics}))
        with pytest.raises(UserError) as error:
            read_record(tmp_path, cell, frozenset({"mse"}))
        assert str(folder / "cell.json") in str(error.value) and expected in str(error.value)
