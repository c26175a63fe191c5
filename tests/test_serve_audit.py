"""The served model and its audit log, in process (the app of `workbench.serve.app` under starlette's test client,
answering a real ptbxl run): ``GET /audit/head`` serves the log's head signed, and the log holds it; when the log's
disk is full (its descriptor moved onto ``/dev/full``: the kernel answers ENOSPC) the request gets 503 and no
answer, ``/health`` turns 503 with that one reason, and every later request is refused with it before its body is
read; a model served with ``--trust-modified`` writes what differed from its seal on every audit line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("wfdb")
pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402
from test_serve import run_dir  # noqa: E402, F401  (a finished ptbxl run)
from workbench.domains.ecg.readers import EMBEDDED_PTBXL  # noqa: E402

from workbench.clinical.predictor import ClinicalPredictor  # noqa: E402
from workbench.serve.app import create_app  # noqa: E402
from workbench.serve.audit import AuditLog, verify_log  # noqa: E402
from workbench.serve.audit_head import Heads, check_heads  # noqa: E402
from workbench.serve.auth import parse_tokens  # noqa: E402
from workbench.serve.limits import Limits  # noqa: E402

RECORD = EMBEDDED_PTBXL / "records100" / "00000"
TOKEN = "t" * 24


def client(run: Path, folder: Path, trust_modified: bool = False) -> tuple[TestClient, AuditLog]:
    audit = AuditLog(folder / "audit.jsonl", heads=Heads(folder / "heads" / "heads.jsonl"))
    predictor = ClinicalPredictor.load(run, trust_modified=trust_modified, device="cpu")
    app = create_app(predictor, parse_tokens(f"ward-7 {TOKEN}", "test"), audit, Limits(timeout_s=60))
    return TestClient(app), audit


def predict(test_client: TestClient, name: str = "00001_lr"):
    files = [("file", (f"{name}{s}", (RECORD / f"{name}{s}").read_bytes())) for s in (".hea", ".dat")]
    return test_client.post("/predict", files=files, headers={"Authorization": f"Bearer {TOKEN}"})


def test_the_served_head_is_signed_and_held_by_the_log(run_dir, tmp_path):  # noqa: F811
    test_client, audit = client(run_dir, tmp_path)
    with test_client:
        assert predict(test_client).status_code == 200
        assert test_client.get("/audit/head").status_code == 401
        head = test_client.get("/audit/head", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    audit.close()
    last = json.loads((tmp_path / "audit.jsonl").read_bytes().splitlines()[-1])
    assert head["seq"] == last["seq"] == 1 and head["head"] == last["sha256"] and head["log"] == "audit.jsonl"
    assert head["heads_file"] == str(tmp_path / "heads" / "heads.jsonl")
    assert check_heads(tmp_path / "audit.jsonl", [head]) == []


def test_a_full_audit_disk_turns_health_503_and_refuses_every_request_with_one_reason(run_dir, tmp_path):  # noqa: F811
    test_client, audit = client(run_dir, tmp_path)
    with test_client:
        assert predict(test_client).status_code == 200
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, audit._fd)  # the log's descriptor now writes where the kernel answers ENOSPC
        os.close(full)
        refused = predict(test_client)
        assert refused.status_code == 503 and "No space left on device" in refused.json()["detail"]
        assert "results" not in refused.json()
        health = test_client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert "No space left on device" in health.json()["reason"]
        later = predict(test_client)
        assert later.status_code == 503 and later.json()["detail"].startswith(health.json()["reason"])
    audit.close()
    assert verify_log(tmp_path / "audit.jsonl").lines == 1  # the answered request's line, nothing torn


def test_a_model_served_with_trust_modified_records_what_differed_on_every_line(run_dir, tmp_path):  # noqa: F811
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    with (copy / "report.md").open("a") as report:
        report.write("\nedited after the run finished\n")
    test_client, audit = client(copy, tmp_path / "serve", trust_modified=True)
    with test_client:
        assert predict(test_client).status_code == 200
    audit.close()
    line = json.loads((tmp_path / "serve" / "audit.jsonl").read_bytes().splitlines()[-1])
    assert "trust-modified" in line["run_seal"]["status"] and "report.md" in json.dumps(line["run_seal"])


def test_a_start_that_fails_before_serving_leaves_no_empty_audit_log(tmp_path):
    from workbench.core.errors import UserError
    from workbench.serve.server import serve

    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"ward-7 {TOKEN}\n")
    tokens.chmod(0o600)
    (tmp_path / "not-a-run").mkdir()
    audit_log = tmp_path / "audit" / "a.jsonl"
    with pytest.raises(UserError, match="not-a-run"):
        serve(tmp_path / "not-a-run", port=0, token_file=tokens, audit_log=audit_log)
    assert not audit_log.exists() and not Path(f"{audit_log}.heads.jsonl").exists()
    existing = tmp_path / "kept.jsonl"
    AuditLog(existing).close()  # a log that was there before the start stays
    with pytest.raises(UserError, match="not-a-run"):
        serve(tmp_path / "not-a-run", port=0, token_file=tokens, audit_log=existing)
    assert existing.exists()
