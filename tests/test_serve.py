"""``workbench serve`` as it runs: a real server (uvicorn in a subprocess on a loopback port) answering a ptbxl run,
called with httpx. A good WFDB upload gets calibrated probabilities (the same as ``workbench predict``'s), a conformal
set, a shift verdict and one audit line; malformed uploads, paths outside the intake folder, missing or wrong tokens
and oversized requests get their 4xx and one-line message, and the server keeps serving; the audit log verifies, and
fails once a line of a copy is edited; SIGTERM drains (in flight: answered; new: 503). The default suite starts the
server once; marked slow: the load test (concurrency 1, 8, 32), kill -9 (no answered line lost; a restart continues
the log), and a physio and an EEG run served (their records answered beat by beat and window by window; an EDF
without the model's channels refused), which start servers of their own or run long."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("wfdb")
import httpx  # noqa: E402  (the serve extra: pip install -e ".[serve]")
from workbench.domains.ecg.readers import EMBEDDED_PTBXL  # noqa: E402

from workbench.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDS = EMBEDDED_PTBXL / "records100" / "00000"
_spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks" / "serve_load.py")
serve_load = sys.modules.setdefault("serve_load", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(serve_load)


def record_files(name: str = "00001_lr") -> dict[str, bytes]:
    return {f"{name}{suffix}": (RECORDS / f"{name}{suffix}").read_bytes() for suffix in (".hea", ".dat")}


GOOD = record_files()


def sha256sum_manifest(files: dict[str, bytes]) -> str:
    """What ``sha256sum A B | sha256sum`` prints for the files in name order: the request's input hash."""
    lines = "".join(f"{hashlib.sha256(files[name]).hexdigest()}  {name}\n" for name in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def audit_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve") / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["adapt", "--domain", "ptbxl", "--method", "readout", "--epochs", "1", "--baselines", "", "--quiet",
              "--out", str(out)])  # fmt: skip
    assert exit_info.value.code == 0
    return out


@pytest.fixture(scope="module")
def intake(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("intake")
    (folder / "ward").mkdir()
    for name, content in record_files("00002_lr").items():
        (folder / "ward" / name).write_bytes(content)
    outside = tmp_path_factory.mktemp("outside")
    for name, content in record_files("00003_lr").items():
        (outside / name).write_bytes(content)
    (folder / "linked").symlink_to(outside)  # a link out of the intake folder
    return folder


@pytest.fixture(scope="module")
def server(run_dir, intake, tmp_path_factory):
    folder = tmp_path_factory.mktemp("server")
    with serve_load.running_server(run_dir, folder, "--intake", str(intake), "--max-request-mb", "1",
                                   "--timeout-s", "30") as running:  # fmt: skip
        yield running


def post(server, files: dict[str, bytes] | None = None, token: str | None = "valid", **kwargs) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {server.token if token == 'valid' else token}"}
    if files is not None:
        kwargs["files"] = [("file", (name, content)) for name, content in files.items()]
    return httpx.post(f"{server.url}/predict", headers=headers, timeout=60, **kwargs)


def test_a_record_upload_is_answered_as_predict_scores_it_and_audited(server, run_dir, tmp_path, capsys):
    files = record_files()
    response = post(server, files)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["input_sha256"] == sha256sum_manifest(files) and response.headers["x-request-id"] == body["request_id"]
    (result,) = body["results"]
    classes = ["NORM", "MI", "STTC", "CD", "HYP"]
    assert result["record"] == "00001_lr" and result["status"] == "ok" and list(result["probabilities"]) == classes
    assert set(result["labels"]) <= set(classes) and set(result["conformal_set"]) <= set(classes)
    assert result["shift"]["verdict"] in ("shift", "no shift", "too few") and result["conformal_kind"]
    assert body["model"]["adapter_sha256"] == hashlib.sha256((run_dir / "adapter.safetensors").read_bytes()).hexdigest()
    # the same record through workbench predict (batch, its own process state): the same calibrated probabilities
    folder = tmp_path / "records"
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--run", str(run_dir), "--input", str(folder), "--output", str(tmp_path / "p.csv")])
    assert exit_info.value.code == 0, capsys.readouterr().err
    (row,) = list(csv.DictReader((tmp_path / "p.csv").open()))
    for name in classes:
        assert result["probabilities"][name] == pytest.approx(float(row[f"calibrated_p_{name}"]), abs=1e-6)
    assert set(result["labels"]) == {name for name in classes if row[f"label_{name}"] == "1"}
    line = audit_lines(server.audit)[-1]
    assert line["request_id"] == body["request_id"] and line["caller"] == "load-test" and line["http_status"] == 200
    assert line["input_sha256"] == body["input_sha256"] and line["outputs"] == body["results"]
    assert line["model"] == body["model"] and line["shift"] == result["shift"]


def test_model_route_describes_the_run(server, run_dir):
    response = httpx.get(f"{server.url}/model", headers={"Authorization": f"Bearer {server.token}"})
    assert response.status_code == 200
    described = response.json()
    assert described["task"] == "ptbxl" and described["method"] == "readout"
    assert described["adapter_sha256"] == hashlib.sha256((run_dir / "adapter.safetensors").read_bytes()).hexdigest()
    assert described["run_seal"]["status"] == "verified" and described["calibration"]["temperatures"]


@pytest.mark.parametrize("scheme, token", [(None, None), ("Bearer", "not-a-known-token-at-all"), ("Basic", "valid")],
                         ids=["none", "wrong", "other-scheme"])  # fmt: skip
def test_a_missing_or_wrong_token_gets_401_and_no_audit_line(server, scheme, token):
    before = len(audit_lines(server.audit))
    headers = {} if scheme is None else {"Authorization": f"{scheme} {server.token if token == 'valid' else token}"}
    for response in (httpx.post(f"{server.url}/predict", headers=headers, files=[("file", i) for i in GOOD.items()]),
                     httpx.get(f"{server.url}/model", headers=headers)):  # fmt: skip
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        said = "is not one of this server's" if scheme == "Bearer" else "a bearer token is required"
        assert said in response.json()["detail"]  # a wrong token is told apart from a missing one
    assert len(audit_lines(server.audit)) == before


def _png_header(width: int, height: int) -> bytes:
    """A PNG signature and IHDR chunk (8-bit RGB) declaring ``width`` × ``height``, with no pixel data."""
    fields = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(fields)) + b"IHDR" + fields + struct.pack(">I", zlib.crc32(b"IHDR" + fields))
    return b"\x89PNG\r\n\x1a\n" + chunk


def _with_header_line(files: dict[str, bytes], line: str) -> dict[str, bytes]:
    header = files["00001_lr.hea"].decode().splitlines()
    return {**files, "00001_lr.hea": "\n".join([line, *header[1:]]).encode() + b"\n"}


BAD_UPLOADS = {
    "truncated-dat": ({**GOOD, "00001_lr.dat": GOOD["00001_lr.dat"][:700]}, 422, "truncated data file"),
    "wrong-rate": (_with_header_line(GOOD, "00001_lr 12 20 1000"), 422, "sampling rate 20 Hz is too low"),
    "long-record": (_with_header_line(GOOD, "00001_lr 12 100 1000000000"), 413, "a record of 10000000 s"),
    "huge-png": ({"scan.png": _png_header(10_000, 10_000)}, 413, "100,000,000 pixels"),
    "hidden-name": ({".00001_lr.hea": GOOD["00001_lr.hea"]}, 400, "expected a plain file name"),
    "no-record": ({"notes.txt": b"nothing to score"}, 422, "no WFDB record"),
    "too-large": ({**GOOD, "padding.bin": os.urandom(1_200_000)}, 413, "limit of 1 MiB"),
}


@pytest.mark.parametrize("case", list(BAD_UPLOADS))
def test_a_bad_upload_gets_its_one_line_message_an_audit_line_and_the_server_keeps_serving(server, case):
    files, status, message = BAD_UPLOADS[case]
    response = post(server, files)
    assert response.status_code == status, response.text
    body = response.json()
    assert message in body["detail"] and "\n" not in body["detail"] and "Traceback" not in response.text
    line = audit_lines(server.audit)[-1]
    assert line["request_id"] == body["request_id"] and line["http_status"] == status
    assert line["detail"] == body["detail"] and (line["outputs"] is None or status == 422)
    assert post(server, GOOD).status_code == 200  # still serving


def test_other_malformed_requests_are_refused_with_4xx(server):
    headers = {"Authorization": f"Bearer {server.token}"}
    text = httpx.post(f"{server.url}/predict", headers=headers, content=b"hello", timeout=30)
    assert text.status_code == 415 and "multipart/form-data" in text.json()["detail"]
    form_only = httpx.post(f"{server.url}/predict", headers=headers, files={"question": (None, "is it normal?")},
                           timeout=30)  # fmt: skip
    assert form_only.status_code == 400 and "without a file" in form_only.json()["detail"]
    broken = httpx.post(f"{server.url}/predict", headers={**headers, "Content-Type": "application/json"},
                        content=b"{not json", timeout=30)  # fmt: skip
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["detail"]
    sanitised = post(server, {f"../../{name}": content for name, content in GOOD.items()})
    assert sanitised.status_code == 200 and audit_lines(server.audit)[-1]["input_files"] == sorted(GOOD)


@pytest.mark.parametrize(
    "path, status, message",
    [
        ("../outside/00003_lr.hea", 400, "without '..'"),
        ("linked/00003_lr.hea", 400, "symbolic link"),
        ("/etc/passwd", 400, "relative to the intake folder"),
        ("ward/missing.hea", 404, "not found"),
    ],
    ids=["dot-dot", "symlink", "absolute", "missing"],
)
def test_an_intake_path_outside_the_folder_is_refused(server, path, status, message):
    response = post(server, json={"path": path})
    assert response.status_code == status and message in response.json()["detail"]
    assert audit_lines(server.audit)[-1]["http_status"] == status


def test_an_intake_path_is_answered_as_the_same_record_uploaded(server):
    by_path = post(server, json={"path": "ward/00002_lr.hea"})
    uploaded = post(server, record_files("00002_lr"))
    assert by_path.status_code == uploaded.status_code == 200, by_path.text
    assert by_path.json()["input_sha256"] == uploaded.json()["input_sha256"] == sha256sum_manifest(
        record_files("00002_lr")
    )
    assert by_path.json()["results"][0]["probabilities"] == uploaded.json()["results"][0]["probabilities"]


def test_audit_verify_passes_on_the_log_and_fails_on_an_edited_copy(server, tmp_path, capsys):
    assert post(server, GOOD).status_code == 200
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "verify", str(server.audit)])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("ok: ")
    lines = server.audit.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 3
    copy = tmp_path / "edited.jsonl"
    edited = lines[1].replace(b'"http_status":', b'"http_status":1', 1)
    assert edited != lines[1]
    copy.write_bytes(b"".join([lines[0], edited, *lines[2:]]))
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "verify", str(copy)])
    assert exit_info.value.code == 1 and "line 2: its content does not match its sha256" in capsys.readouterr().err


def _half_sent(url: str, token: str, files: dict[str, bytes]) -> tuple[socket.socket, bytes]:
    """A /predict request whose headers and first 100 body bytes are sent (the rest returned): in flight."""
    request = httpx.Request("POST", f"{url}/predict", files=[("file", item) for item in files.items()])
    body = request.read()
    head = (f"POST /predict HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\nContent-Type: "
            f"{request.headers['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    connection = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    connection.sendall(head + body[:100])
    return connection, body[100:]


def _response(connection: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
        data.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
    ):
        chunk = connection.recv(1 << 16)
        assert chunk, f"connection closed: {data[:300]!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


def test_the_command_refuses_bad_settings_before_loading_anything(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORKBENCH_SERVE_TOKENS", raising=False)
    code = _exit_code(["serve", "--run", str(run_dir)], capsys)
    assert code[0] == 2 and "no tokens" in code[1]
    short = tmp_path / "short.txt"
    short.write_text("ward-7 abc\n")
    code = _exit_code(["serve", "--run", str(run_dir), "--token-file", str(short)], capsys)
    assert code[0] == 2 and "at least 16" in code[1]
    monkeypatch.setenv("WORKBENCH_SERVE_TOKENS", "ward-7 " + "x" * 32)
    code = _exit_code(["serve", "--run", str(run_dir), "--audit-log", str(run_dir / "audit.jsonl")], capsys)
    assert code[0] == 2 and "inside the run folder" in code[1] and not (run_dir / "audit.jsonl").exists()
    code = _exit_code(["serve", "--run", str(run_dir), "--intake", str(tmp_path / "none")], capsys)
    assert code[0] == 2 and "--intake" in code[1]


def _exit_code(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.slow
def test_load_at_concurrency_1_8_32_loses_duplicates_and_crosses_nothing(server):
    records = serve_load.embedded_records(24)
    for level in (1, 8, 32):
        row = serve_load.load_level(server, records, level, seconds=8.0)["row"]
        assert row["answered"] >= level and row["p50_ms"] <= row["p99_ms"], row
        assert row["lost"] == row["duplicated"] == row["crossed"] == row["audit_mismatches"] == 0, row
    assert subprocess.run([sys.executable, "-m", "workbench", "audit", "verify", str(server.audit)]).returncode == 0


@pytest.mark.slow
def test_kill_9_keeps_every_answered_line_and_a_restart_continues_the_log(run_dir, tmp_path, capsys):
    """Also: a request past ``--timeout-s`` (here 0.02 s) gets 504 (408 if its body was not read in time)."""
    audit = tmp_path / "audit.jsonl"
    with serve_load.running_server(run_dir, tmp_path / "first", audit=audit) as first:
        answered = [post(first, record_files(name)) for name in ("00001_lr", "00002_lr")]
        assert [r.status_code for r in answered] == [200, 200]
        first.process.kill()  # SIGKILL right after the answers: no shutdown code runs
        first.process.wait()
    assert [line["request_id"] for line in audit_lines(audit)] == [r.json()["request_id"] for r in answered]
    with serve_load.running_server(run_dir, tmp_path / "second", "--timeout-s", "0.02", audit=audit) as second:
        late = post(second, GOOD)
        assert late.status_code in (408, 504) and "no answer within 0.02 s" in late.json()["detail"]
        assert httpx.get(f"{second.url}/health").status_code == 200
    lines = audit_lines(audit)
    assert [line["seq"] for line in lines] == [1, 2, 3] and lines[2]["prev"] == lines[1]["sha256"]
    assert lines[2]["http_status"] == late.status_code and lines[2]["request_id"] == late.json()["request_id"]
    assert _exit_code(["audit", "verify", str(audit)], capsys)[0] == 0


@pytest.mark.slow
def test_a_physio_record_is_answered_beat_by_beat(tmp_path):
    """Another task's format through the same server: a heartbeat record (WFDB header, signal and beat annotations)
    gets one answer per annotated beat, each with its class probabilities, set and the batch's shift verdict."""
    from workbench.domains.physio.task import EMBEDDED

    run = tmp_path / "physio"
    with pytest.raises(SystemExit) as exit_info:
        main(["adapt", "--domain", "physio", "--method", "readout", "--epochs", "1", "--baselines", "", "--quiet",
              "--out", str(run)])  # fmt: skip
    assert exit_info.value.code == 0
    files = {p.name: p.read_bytes() for p in sorted((EMBEDDED / "site-B").glob("B01.*"))}
    assert sorted(files) == ["B01.atr", "B01.dat", "B01.hea"]
    with serve_load.running_server(run, tmp_path / "server") as server:
        response = post(server, files)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert len(results) > 50 and {r["record"] for r in results} == {"B01"}
    for result in results:
        assert result["status"] == "ok" and result["labels"] and set(result["labels"]) <= set(result["probabilities"])
        assert sum(result["probabilities"].values()) == pytest.approx(1.0, abs=1e-9)
        assert result["shift"]["batch"] == len(results) and result["shift"]["verdict"] in ("shift", "no shift")


@pytest.mark.slow
def test_an_eeg_recording_is_answered_window_by_window_and_one_without_its_channels_is_refused(tmp_path):
    """An EDF recording gets one answer per 30 s window; the same file with its channel labels renamed (EDF header
    bytes 256 + 16·k) gets 422 with the reader's message naming the missing channels."""
    pytest.importorskip("braindecode")
    run = tmp_path / "sleep"
    with pytest.raises(SystemExit) as exit_info:
        main(["adapt", "--domain", "sleepedf", "--method", "readout", "--epochs", "1", "--baselines", "", "--quiet",
              "--out", str(run)])  # fmt: skip
    assert exit_info.value.code == 0
    folder = ROOT / "domains" / "eeg" / "embedded" / "sleep-edf" / "sleep-cassette"
    psg = (folder / "SC4001E0-PSG.edf").read_bytes()
    signals = int(psg[252:256])
    renamed = psg[:256] + b"".join(f"XX{k:<14}".encode() for k in range(signals)) + psg[256 + 16 * signals :]
    with serve_load.running_server(run, tmp_path / "server") as server:
        good = post(server, {"SC4001E0-PSG.edf": psg})
        refused = post(server, {"renamed.edf": renamed})
    assert good.status_code == 200, good.text
    results = good.json()["results"]
    assert len(results) >= 10 and all(r["status"] == "ok" and r["labels"] for r in results)
    assert [float(r["where"]["onset_s"]) for r in results] == [30.0 * k for k in range(len(results))]
    assert refused.status_code == 422 and "EEG Fpz-Cz, EEG Pz-Oz missing" in refused.json()["detail"]


def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(server, capsys):
    """Ends the module's server: it stays the last test of this file."""
    connection, rest = _half_sent(server.url, server.token, GOOD)
    time.sleep(0.5)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert httpx.get(f"{server.url}/health").status_code == 503
    refused = post(server, GOOD)
    assert refused.status_code == 503 and "shutting down" in refused.json()["detail"]
    connection.sendall(rest)
    status, body = _response(connection)
    connection.close()
    assert status == 200 and body["results"][0]["status"] == "ok"
    assert server.process.wait(30) == 0
    assert audit_lines(server.audit)[-1]["request_id"] == body["request_id"]
    assert _exit_code(["audit", "verify", str(server.audit)], capsys)[0] == 0
