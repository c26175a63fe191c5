"""``workbench serve`` against hostile requests (issue 53): a deflated DICOM decompression bomb and a body longer than
its ``Content-Length`` (chunked) are cut within their budgets while ``/health`` keeps answering; one caller's traffic
never changes another's answers; and the low defects: a WFDB rate of -100, a NUL in an intake path, a deeply nested
JSON body, a client that disconnects, ``#`` and non-ASCII characters in tokens, headers whose extent cannot be told,
and spool folders left by a killed server."""

from __future__ import annotations

import io
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

pytest.importorskip("wfdb")
pydicom = pytest.importorskip("pydicom")
psutil = pytest.importorskip("psutil")
import httpx  # noqa: E402
from test_serve import GOOD, audit_lines, post, record_files, run_dir, serve_load  # noqa: E402, F401

from workbench.core import dicom  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.serve.auth import parse_tokens  # noqa: E402
from workbench.serve.limits import Limits, check_upload  # noqa: E402
from workbench.serve.uploads import Refused, intake_files  # noqa: E402

TOKEN_B = "b-" + "x" * 30
#: What the server may grow by while refusing a bomb or a flood [bytes] (before the fix: +1.6 GB and +600 MB).
RSS_BOUND = 300 << 20


def _element(group: int, element: int, vr: bytes, value: bytes) -> bytes:
    """One explicit-VR little-endian data element."""
    return struct.pack("<HH2sH", group, element, vr, len(value)) + value


def deflated_bomb(path: Path, rows: int = 100, columns: int = 100, inflated: int = 1 << 30) -> Path:
    """A DICOM file (Deflated Explicit VR Little Endian) declaring ``rows`` × ``columns`` 16-bit pixels whose
    PixelData holds ``inflated`` zero bytes: about 1 MB on disk for 1 GiB inflated (1 MiB blocks of zeros, each
    deflated once at level 9 after a full flush, so every block is the same bytes)."""
    meta = pydicom.dataset.FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = "1.2.840.10008.5.1.4.1.1.7", "1.2.3.4"
    meta.TransferSyntaxUID = dicom.DEFLATED
    head = io.BytesIO()
    empty = pydicom.Dataset()
    empty.file_meta = meta
    empty.save_as(head, enforce_file_format=True)
    prefix = head.getvalue()
    prefix = prefix[: 144 + struct.unpack("<I", prefix[140:144])[0]]  # preamble, DICM and the meta group only
    elements = b"".join(_element(0x0028, tag, b"US", struct.pack("<H", value))
                        for tag, value in ((0x0002, 1), (0x0010, rows), (0x0011, columns), (0x0100, 16)))  # fmt: skip
    elements += struct.pack("<HH2sHI", 0x7FE0, 0x0010, b"OW", 0, inflated)
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    start = first.compress(elements) + first.flush(zlib.Z_FULL_FLUSH)
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = block.compress(bytes(1 << 20)) + block.flush(zlib.Z_FULL_FLUSH)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    path.write_bytes(prefix + start + block * (inflated >> 20) + end)
    return path


def _rss(process: subprocess.Popen) -> int:
    return psutil.Process(process.pid).memory_info().rss


@pytest.fixture(scope="module")
def spool(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spool")


@pytest.fixture(scope="module")
def server(run_dir, spool, tmp_path_factory):  # noqa: F811
    """A server with two callers (``load-test`` and ``caller-b``), 2 MiB requests and its spool under ``spool``."""
    folder = tmp_path_factory.mktemp("hardened")
    intake = tmp_path_factory.mktemp("intake")
    token = secrets.token_urlsafe()
    tokens = folder / "two-callers.txt"
    tokens.write_text(f"load-test {token}\ncaller-b {TOKEN_B}\n")
    tokens.chmod(0o600)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(secrets, "token_urlsafe", lambda: token)
        patch.setenv("WORKBENCH_SERVE_SPOOL", str(spool))
        with serve_load.running_server(run_dir, folder, "--token-file", str(tokens), "--max-request-mb", "2",
                                       "--intake", str(intake), "--timeout-s", "60") as running:  # fmt: skip
            yield running


def _poll_health(url: str, stop: threading.Event, times: list[float]) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
            times.append(time.monotonic() - started)
        except httpx.HTTPError:
            times.append(float("inf"))
        time.sleep(0.05)


def test_a_deflated_dicom_bomb_is_refused_by_the_shared_reader_within_bounded_memory(tmp_path):
    bomb = deflated_bomb(tmp_path / "bomb.dcm")
    assert bomb.stat().st_size < 1_100_000
    with pytest.raises(dicom.DicomRefused, match="inflates past 4,214,304 bytes") as refused:
        dicom.read_header(bomb, 50_000_000)
    assert refused.value.too_large
    # the image reader (the same function) in a process that may not grow by 300 MiB: a clear refusal, no MemoryError
    script = (f"import resource, re\nsize = int(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read())"
              f".group(1)) * 1024\nfrom workbench.domains.medvl.images import load_image\nimport monai.transforms\n"
              f"size = int(re.search(r'VmSize:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024\n"
              f"resource.setrlimit(resource.RLIMIT_AS, (size + {RSS_BOUND}, -1))\n"
              f"load_image({str(bomb)!r})\n")  # fmt: skip
    pytest.importorskip("monai")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "MemoryError" not in result.stderr, result.stderr[-2000:]
    assert "bomb.dcm: its deflated dataset inflates past 4,214,304 bytes" in result.stderr.splitlines()[-1]
    small = deflated_bomb(tmp_path / "small.dcm", 10, 10, 200)  # a deflated file within its budget is read
    assert int(dicom.read_header(small, 1000).Rows) == 10 and pydicom.dcmread(small).Columns == 10


def test_a_deflated_dicom_bomb_gets_413_while_health_keeps_answering(server, tmp_path):
    bomb = deflated_bomb(tmp_path / "scan.dcm")
    before = _rss(server.process)
    stop, times = threading.Event(), []
    poller = threading.Thread(target=_poll_health, args=(server.url, stop, times))
    poller.start()
    try:
        time.sleep(0.3)
        response = post(server, {"scan.dcm": bomb.read_bytes()})
        time.sleep(0.3)
    finally:
        stop.set()
        poller.join()
    assert times and max(times) < 1.0, times  # every /health within 1 s while the upload was checked
    assert _rss(server.process) - before < RSS_BOUND
    assert response.status_code == 413, response.text
    assert "scan.dcm: its deflated dataset inflates past" in response.json()["detail"]
    assert post(server, GOOD).status_code == 200


def _raw_chunked_flood(url: str, token: str, total: int) -> tuple[int, bytes, int]:
    """A /predict request declaring ``Content-Length: 29`` and ``Transfer-Encoding: chunked`` whose chunks carry up
    to ``total`` bytes, sent until the server stops reading; (status, body, bytes sent)."""
    connection = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    connection.settimeout(3)
    head = (f"POST /predict HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json"
            "\r\nContent-Length: 29\r\nTransfer-Encoding: chunked\r\n\r\n").encode()  # fmt: skip
    connection.sendall(head)
    chunk = b"%x\r\n" % (1 << 16) + b" " * (1 << 16) + b"\r\n"
    sent = 0
    try:
        while sent < total:
            connection.sendall(chunk)
            sent += 1 << 16
    except OSError:  # the server answered and stopped reading (a timeout, a reset or a broken pipe)
        pass
    connection.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            piece = connection.recv(1 << 16)
            if not piece:
                break
            data += piece
    except OSError:
        pass
    connection.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body, sent


def test_a_chunked_body_past_the_limit_is_cut_whatever_content_length_says(server):
    before = _rss(server.process)
    status, body, sent = _raw_chunked_flood(server.url, server.token, 200 << 20)
    assert status == 413 and b"limit of 2 MiB" in body, body
    assert sent < 100 << 20  # the server stopped reading long before the 200 MiB were sent
    assert _rss(server.process) - before < RSS_BOUND
    line = audit_lines(server.audit)[-1]
    assert line["http_status"] == 413 and "the rest was not read" in line["detail"]
    longer = httpx.post(f"{server.url}/predict", timeout=30, content=b'{"path": "x"}',
                        headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json",
                                 "Transfer-Encoding": "chunked", "Content-Length": "5"})  # fmt: skip
    assert longer.status_code == 400 and "where Content-Length says 5" in longer.json()["detail"]


def test_one_caller_s_uploads_never_change_another_s_answers(server, run_dir, tmp_path):  # noqa: F811
    from workbench.clinical.predictor import ClinicalPredictor

    fresh = ClinicalPredictor.load(run_dir)
    folder = tmp_path / "record"
    folder.mkdir()
    for name, content in record_files("00003_lr").items():
        (folder / name).write_bytes(content)
    expected = fresh.answer(folder, "caller-b")[0]
    for record in serve_load.embedded_records(20):  # caller A fills its window
        assert post(server, record["files"]).status_code == 200
    answer = post(server, record_files("00003_lr"), token=TOKEN_B).json()["results"][0]
    assert answer["shift"] == expected["shift"] and answer["conformal_set"] == expected["conformal_set"]
    for name, value in expected["probabilities"].items():
        assert answer["probabilities"][name] == pytest.approx(value, abs=1e-6)
    # in one process: caller a's traffic leaves caller b's state as it was
    loaded = ClinicalPredictor.load(run_dir)
    for _ in range(3):
        loaded.answer(folder, "a")
    assert loaded.answer(folder, "caller-b")[0]["shift"] == expected["shift"]


def test_a_wfdb_rate_of_minus_100_is_refused_naming_the_file_and_field(server, tmp_path):
    from workbench.domains.ecg import read_raw_record

    files = record_files()
    lines = files["00001_lr.hea"].decode().splitlines()
    words = lines[0].split()
    lines[0] = " ".join([words[0], words[1], "-100", *words[3:]])
    (tmp_path / "00001_lr.hea").write_text("\n".join(lines) + "\n")
    (tmp_path / "00001_lr.dat").write_bytes(files["00001_lr.dat"])
    assert check_upload(tmp_path / "00001_lr.hea", Limits()) == (
        422, "00001_lr.hea: record line field 3 (sampling rate [Hz]) is '-100': expected a positive number")
    with pytest.raises(UserError, match=r"00001_lr\.hea.*sampling rate field \(the 3rd\) is '-100'; expected a "
                                        "positive number"):  # fmt: skip
        read_raw_record(tmp_path / "00001_lr.hea")
    response = post(server, {**files, "00001_lr.hea": (tmp_path / "00001_lr.hea").read_bytes()})
    assert response.status_code == 422 and "'-100': expected a positive number" in response.json()["detail"]


def test_a_nul_in_an_intake_path_gets_400(server, tmp_path):
    with pytest.raises(Refused, match="a NUL character") as refused:
        intake_files(tmp_path, "ward/\x00x.hea")
    assert refused.value.status == 400
    response = post(server, json={"path": "ward/\x00x.hea"})
    assert response.status_code == 400 and "NUL" in response.json()["detail"]


def test_a_deeply_nested_json_body_gets_400(server):
    nested = b"[" * 100_000 + b"]" * 100_000
    response = httpx.post(f"{server.url}/predict", content=nested, timeout=30,
                          headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"})
    assert response.status_code == 400 and "nested too deeply" in response.json()["detail"]


def test_a_client_that_disconnects_mid_request_is_audited_and_logged_without_a_traceback(server):
    log = next(Path(server.audit).parent.glob("server-*.log"))
    before = len(audit_lines(server.audit))
    request = httpx.Request("POST", f"{server.url}/predict", files=[("file", item) for item in GOOD.items()])
    body = request.read()
    connection = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    connection.sendall((f"POST /predict HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {server.token}\r\n"
                        f"Content-Type: {request.headers['content-type']}\r\nContent-Length: {len(body)}\r\n\r\n"
                        ).encode() + body[:100])  # fmt: skip
    time.sleep(0.5)
    connection.close()
    deadline = time.monotonic() + 10
    while len(audit_lines(server.audit)) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    line = audit_lines(server.audit)[-1]
    assert line["http_status"] == 499 and "the client disconnected while reading the request" in line["detail"]
    text = log.read_text()
    assert "Traceback" not in text and "the client disconnected" in text
    assert post(server, GOOD).status_code == 200


def test_a_hash_inside_a_token_and_non_ascii_tokens_are_refused_with_a_clear_message(server):
    with pytest.raises(UserError, match=r"t\.txt: entry 1 \(ward-7\): the token has a character other than "):
        parse_tokens("ward-7 " + "a" * 20 + "#cut", "t.txt")
    with pytest.raises(UserError, match="printable ASCII"):
        parse_tokens("ward-7 " + "é" * 20, "t.txt")
    kept = parse_tokens("lab " + "b" * 20 + " # a comment\n# a line\n", "t.txt")
    assert kept.caller("Bearer " + "b" * 20) == "lab" and kept.caller("Bearer " + "é" * 20) is None
    raw = httpx.post(f"{server.url}/predict", headers={"Authorization": "Bearer ".encode() + "é".encode() * 20},
                     files=[("file", item) for item in GOOD.items()], timeout=30)  # fmt: skip
    assert raw.status_code == 401


def test_headers_whose_extent_cannot_be_told_are_refused(tmp_path):
    limits = Limits(max_record_seconds=3600, max_pixels=1_000_000)
    edf = bytearray(b" " * 256)
    edf[236:244], edf[244:252] = b"0       ", b"30      "
    (tmp_path / "none.edf").write_bytes(bytes(edf))
    assert check_upload(tmp_path / "none.edf", limits) == (422, "none.edf: EDF header field 'number of data records' "
                                                           "(bytes 236-243) is '0': expected a positive number")
    # -1 (unknown): told from the size; one signal of 100 samples per 30 s record, 200 records: 6000 s
    edf[0:8], edf[236:244], edf[252:256] = b"0       ", b"-1      ", b"1   "
    signal = bytearray(b" " * 256)
    signal[216:224] = b"100     "
    (tmp_path / "unknown.edf").write_bytes(bytes(edf) + bytes(signal) + bytes(200 * 200))
    assert "a record of 6000 s, above this server's limit of 3600 s" in check_upload(tmp_path / "unknown.edf",
                                                                                     limits)[1]  # fmt: skip
    (tmp_path / "LONG.HEA").write_text("LONG 12 100 720000\n")
    assert check_upload(tmp_path / "LONG.HEA", limits)[0] == 413
    (tmp_path / "norate.hea").write_text("norate 12\n")
    assert check_upload(tmp_path / "norate.hea", limits)[0] == 422
    deflated_bomb(tmp_path / "IMAGE0001", 2000, 2000, 1 << 20)  # no suffix: image readers take it as DICOM
    assert check_upload(tmp_path / "IMAGE0001", limits) == (413, "IMAGE0001: an image of 4,000,000 pixels, above "
                                                            "this server's limit of 1,000,000 (--max-pixels); "
                                                            "downsample it")  # fmt: skip
    nifti = bytearray(348)
    nifti[:4] = struct.pack("<i", 348)
    nifti[40:56] = struct.pack("<8h", 3, 1000, 1000, 100, 1, 1, 1, 1)
    (tmp_path / "volume.nii.gz").write_bytes(__import__("gzip").compress(bytes(nifti)))
    assert "an image of 100,000,000 pixels" in check_upload(tmp_path / "volume.nii.gz", limits)[1]


def test_spool_folders_of_killed_servers_are_removed_at_start(server, run_dir, spool, tmp_path):  # noqa: F811
    own = spool / f"workbench-serve-{server.process.pid}"
    assert own.is_dir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = spool / f"workbench-serve-{dead.pid}"
    (left / "request-x").mkdir(parents=True)
    (left / "request-x" / "00001_lr.dat").write_bytes(b"patient data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKBENCH_SERVE_SPOOL", str(spool))
        with serve_load.running_server(run_dir, tmp_path / "second") as second:
            assert not left.exists() and own.is_dir()  # the dead one's removed, the live one's kept
            assert (spool / f"workbench-serve-{second.process.pid}").is_dir()
            second.process.kill()
            second.process.wait()
    assert (spool / f"workbench-serve-{second.process.pid}").is_dir()  # kill -9: left, removed at the next start
    assert all(name.startswith("request-") for name in os.listdir(own))


def test_a_check_past_its_memory_or_wall_budget_is_refused_and_its_worker_replaced():
    from workbench.serve.decoding import CheckFailed, CheckPool

    pool = CheckPool(workers=1, memory_bytes=128 << 20, cpu_seconds=5, timeout_s=2)
    try:
        with pytest.raises(CheckFailed, match=r"within 2 s and 128 MiB \(memory\)") as refused:
            pool.call(bytearray, 1 << 30)  # 1 GiB in a worker that may add 128 MiB
        assert refused.value.status == 413
        started = time.monotonic()
        with pytest.raises(CheckFailed, match="could not be checked within 2 s"):
            pool.call(time.sleep, 60)
        assert time.monotonic() - started < 10  # killed at its wall limit, not waited for
        assert pool.call(len, b"abc") == 3  # a fresh worker answers
    finally:
        pool.close()
