"""The monitoring page (`workbench.serve.dashboard`): read from the end of a live audit log (complete lines only, at
most ``max_lines``, a torn last line ignored), its numbers checked against a hand-written log, every text from the
log escaped, an empty log; then served: a real server (uvicorn in a subprocess) answers a few ptbxl records and
refuses one, ``GET /dashboard`` needs the token, and the page is loaded in headless Chromium (the OS package), whose
rendered DOM holds the request counts and the audit head of ``GET /audit/head`` and whose screenshot shows the plots;
``workbench dashboard`` writes the same page offline. Without Chromium the browser test is skipped, except in CI
(``$CI`` set), where it fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("wfdb")
import httpx  # noqa: E402  (the serve extra)
from test_serve import run_dir, serve_load  # noqa: E402, F401  (a finished ptbxl run; the live-server helper)

from workbench.cli import main  # noqa: E402
from workbench.serve import dashboard  # noqa: E402
from workbench.serve.audit import GENESIS, AuditLog, verify_log  # noqa: E402

CLASSES = ["NORM", "MI", "STTC", "CD", "HYP"]
START = datetime(2026, 3, 2, 8, 0, tzinfo=timezone.utc)
XSS_RECORD = '<script>alert("record")</script>'
XSS_CALLER = "<img src=x onerror=alert(1)>"
XSS_DETAIL = "</td><script>alert(2)</script>"


def entry(minutes: float, status: int = 200, caller: str = "ward-7", record: str = "00001_lr", top: float = 0.8,
          conformal_set: list[str] | None = None, p_value: float | None = 0.5,
          detail: str | None = None) -> dict:  # fmt: skip
    """An audit entry as `workbench.serve.app` writes one: answered (one item whose top probability is ``top``) or
    refused (``status`` other than 200, with ``detail``)."""
    shift = None if p_value is None else {"statistic": 0.1, "p_value": p_value, "window": 8, "batch": 1,
                                          "verdict": "shift" if p_value <= 0.05 else "no shift"}  # fmt: skip
    outputs = None
    if status == 200:
        probabilities = {name: (top if name == "MI" else 0.05) for name in CLASSES}
        outputs = [{"record": record, "status": "ok", "labels": ["MI"], "probabilities": probabilities,
                    "conformal_set": ["MI"] if conformal_set is None else conformal_set, "conformal_kind": "split",
                    "shift": shift}]  # fmt: skip
    moment = (START + timedelta(minutes=minutes)).isoformat(timespec="milliseconds")
    return {"time": moment, "request_id": f"r{minutes}", "caller": caller, "http_status": status, "seconds": 0.01,
            "input_sha256": None, "input_files": [], "model": {}, "run_seal": None, "workbench_version": "test",
            "outputs": outputs, "shift": shift if status == 200 else None, "detail": detail}  # fmt: skip


def write_log(path: Path, entries: list[dict]) -> None:
    audit = AuditLog(path)
    for item in entries:
        audit.append(item)
    audit.close()


@pytest.fixture(scope="module")
def description(run_dir) -> dict:  # noqa: F811
    from workbench.clinical.predictor import ClinicalPredictor

    return ClinicalPredictor.load(run_dir, device="cpu").describe()


class Elements(HTMLParser):
    """The start tags of a page (name, attributes) and the text of each element with an id."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.by_id: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in ("br", "meta", "rect", "circle", "line", "polyline", "i"):
            self._open.append((tag, dict(attrs).get("id")))
            if dict(attrs).get("id"):
                self.by_id[dict(attrs)["id"]] = ""

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if any(name == tag for name, _ in self._open):
            while self._open.pop()[0] != tag:
                pass

    def handle_data(self, data: str) -> None:
        for _, element_id in self._open:
            if element_id:
                self.by_id[element_id] += data

    def count(self, tag: str, **attributes: str) -> int:
        return sum(name == tag and all(attrs.get(k) == v for k, v in attributes.items()) for name, attrs in self.tags)


# --- reading the log ------------------------------------------------------------------------------------------------


def test_the_tail_is_the_last_complete_lines_and_a_torn_end_is_ignored(tmp_path, monkeypatch):
    log = tmp_path / "audit.jsonl"
    write_log(log, [entry(i) for i in range(250)])
    head = verify_log(log).head
    with open(log, "ab") as handle:
        handle.write(b'{"caller":"ward-7","detail":nu')  # a line being written (or torn)
    for block in (1 << 20, 997):  # one read, and many blocks cut inside lines
        monkeypatch.setattr(dashboard, "_BLOCK", block)
        tail = dashboard.read_tail(log, max_lines=100)
        assert (tail.lines_read, tail.left_out, tail.seq, tail.head) == (100, True, 250, head)
        assert [e["seq"] for e in tail.requests] == list(range(151, 251)) and tail.incomplete_end == 30
        assert tail.chain_problem is None and tail.unreadable == 0
        whole = dashboard.read_tail(log)
        assert (whole.lines_read, whole.left_out, whole.requests[0]["seq"]) == (250, False, 1)
    lines = log.read_bytes().split(b"\n")
    lines[200] = lines[200].replace(b'"caller":"ward-7"', b'"caller":"ward-8"')  # line seq 201 edited
    log.write_bytes(b"\n".join(lines))
    tail = dashboard.read_tail(log, max_lines=100)
    assert tail.chain_problem.startswith("line seq 201: its content does not match its sha256")
    assert tail.lines_read == 100 and tail.seq == 250


def test_read_tail_refuses_a_missing_log_and_a_bad_count(tmp_path):
    with pytest.raises(dashboard.UserError, match="no such file"):
        dashboard.read_tail(tmp_path / "none.jsonl")
    (tmp_path / "a.jsonl").write_text("")
    with pytest.raises(dashboard.UserError, match="--max-lines 0: expected a positive number"):
        dashboard.read_tail(tmp_path / "a.jsonl", max_lines=0)


# --- the page's numbers, escaping, an empty log ----------------------------------------------------------------------


def test_the_page_shows_the_logs_numbers(tmp_path, description):
    entries = [entry(0, top=0.82, conformal_set=["MI"], p_value=0.002),  # an alarm
               entry(70, top=0.97, conformal_set=[], p_value=0.4),  # an empty set
               entry(75, status=422, detail="x.hea: bad header"),
               entry(180, top=0.41, conformal_set=CLASSES, p_value=None)]  # every class; no verdict (too few)
    log = tmp_path / "audit.jsonl"
    write_log(log, entries)
    text = dashboard.page(log, description, alpha=0.05)
    page = Elements(text)
    numbers = {key: page.by_id[f"summary-{key}"] for key in ("requests", "answered", "refused", "items-scored",
                                                            "shift-verdicts", "shift-alarms", "callers")}  # fmt: skip
    assert numbers == {"requests": "4", "answered": "3", "refused": "1", "items-scored": "3", "shift-verdicts": "2",
                       "shift-alarms": "1", "callers": "1"}  # fmt: skip
    assert page.by_id["head-seq"] == "4" and page.by_id["head-sha256"] == verify_log(log).head
    assert page.by_id["head-hash-chain"].startswith("the lines read link up")
    assert page.by_id["summary-first-request"] == "2026-03-02 08:00:00 UTC"
    # 3 h span: bins of 10 min; the histogram's three bars where the top probabilities fall
    assert "time (UTC), bins of 10 min" in text
    bars = re.findall(r"<title>(\[[0-9.]+, [0-9.]+\): \d+)</title>", text)
    assert bars == ["[0.40, 0.45): 1", "[0.80, 0.85): 1", "[0.95, 1.00): 1"]
    assert page.count("circle", **{"class": "alarm"}) == 1 and page.count("circle", **{"class": "point"}) == 1
    assert "α = 0.05" in text and "(red; 1 in all, 33.3%)" in text and "(grey; 1 in all, 33.3%)" in text
    assert page.count("svg", **{"class": "plot"}) == 5
    assert page.by_id["card-task"] == "ptbxl" and page.by_id["card-seal"] == "verified"
    assert page.by_id["refusals"].count("x.hea: bad header") == 1
    assert "://" not in text and "href" not in text and "src=" not in text  # no address of any kind


def test_every_text_from_the_log_is_escaped(tmp_path, description):
    log = tmp_path / "audit.jsonl"
    write_log(log, [entry(0, caller=XSS_CALLER, record=XSS_RECORD, p_value=0.002),
                    entry(1, status=422, caller=XSS_CALLER, detail=XSS_DETAIL)])  # fmt: skip
    text = dashboard.page(log, description)
    page = Elements(text)
    assert page.count("script") == 0 and page.count("img") == 0  # only the page's own elements
    assert "&lt;script&gt;alert(&quot;record&quot;)&lt;/script&gt;" in text and XSS_RECORD not in text
    assert XSS_RECORD in page.by_id["alarms"] and XSS_CALLER in page.by_id["callers"]
    assert XSS_DETAIL in page.by_id["refusals"]


def test_an_empty_log_renders_and_says_no_requests_yet(tmp_path, description):
    write_log(tmp_path / "audit.jsonl", [])
    page = Elements(dashboard.page(tmp_path / "audit.jsonl", description))
    assert "No requests yet" in page.by_id["no-requests"] and page.count("svg") == 0
    assert page.by_id["summary-requests"] == "0" and page.by_id["head-seq"] == "0"
    assert page.by_id["head-sha256"] == GENESIS


# --- served, in a real browser --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's ``chromium`` (or ``chromium-browser``): skipped when absent, except in CI, where it must be there."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI: chromium is not installed (.ci/run installs it with apt-get install chromium)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium); CI runs this test")
    return found


def browse(chromium: str, page: Path, *flags: str) -> str:
    """Headless Chromium on the file ``page`` with ``flags``: what it prints."""
    result = subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             f"--user-data-dir={page.parent / 'chromium-profile'}", *flags, page.as_uri()],
                            capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def served(run_dir, tmp_path_factory):  # noqa: F811
    """A real server that answered 4 embedded records and refused a malformed one."""
    with serve_load.running_server(run_dir, tmp_path_factory.mktemp("dashboard-server"), "--timeout-s", "60") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        for record in serve_load.embedded_records(4):
            files = [("file", item) for item in record["files"].items()]
            assert httpx.post(f"{server.url}/predict", headers=headers, files=files, timeout=60).status_code == 200
        bad = [("file", ("x.hea", b"garbage\n"))]
        assert httpx.post(f"{server.url}/predict", headers=headers, files=bad, timeout=60).status_code == 422
        yield server


def test_the_served_page_needs_the_token_and_renders_in_chromium(chromium, served, tmp_path):
    assert httpx.get(f"{served.url}/dashboard").status_code == 401
    wrong = httpx.get(f"{served.url}/dashboard", headers={"Authorization": "Bearer not-a-known-token-at-all"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    headers = {"Authorization": f"Bearer {served.token}"}
    response = httpx.get(f"{served.url}/dashboard", headers=headers, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    head = httpx.get(f"{served.url}/audit/head", headers=headers).json()
    lines = [json.loads(line) for line in served.audit.read_text().splitlines()]
    assert len(lines) == 5 and head["seq"] == 5  # the dashboard's own GETs are not audited
    scored = [o for line in lines for o in line["outputs"] or () if o["status"] == "ok"]
    with_p = [line for line in lines if line["shift"] and line["shift"]["p_value"] is not None]

    page = tmp_path / "dashboard.html"
    page.write_text(response.text)
    dom = Elements(browse(chromium, page, "--dump-dom"))
    assert dom.by_id["summary-requests"] == "5" and dom.by_id["summary-answered"] == "4"
    assert dom.by_id["summary-refused"] == "1" and dom.by_id["summary-items-scored"] == str(len(scored))
    assert dom.by_id["head-seq"] == "5" and dom.by_id["head-sha256"] == head["head"]
    assert dom.by_id["card-task"] == "ptbxl" and dom.by_id["card-method"] == "readout"
    plots = {attrs["id"] for tag, attrs in dom.tags if tag == "svg"}
    assert plots == {"plot-requests", "plot-shift", "plot-set-size", "plot-set-shares", "plot-top-probability"}
    assert len(with_p) >= 1 and dom.count("circle", **{"class": "alarm"}) + dom.count(
        "circle", **{"class": "point"}) == len(with_p)  # fmt: skip

    shot = tmp_path / "dashboard.png"
    browse(chromium, page, f"--screenshot={shot}", "--window-size=1280,2000", "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(shot) as image:
        pixels = image.convert("RGB")
        assert pixels.size == (1280, 2000)
        colours = pixels.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # not one flat colour: text, frames, bars
    green = sum(n for n, rgb in colours if max(abs(a - b) for a, b in zip(rgb, (0x2E, 0x7D, 0x32))) <= 8)
    assert green > 500  # the HTTP 200 bars of the requests plot were drawn

    hostile = tmp_path / "hostile"
    hostile.mkdir()
    write_log(hostile / "audit.jsonl", [entry(0, caller=XSS_CALLER, record=XSS_RECORD, p_value=0.002)])
    (hostile / "page.html").write_text(dashboard.page(hostile / "audit.jsonl", {"task": "ptbxl"}))
    rendered = Elements(browse(chromium, hostile / "page.html", "--dump-dom"))
    assert rendered.count("script") == 0 and rendered.count("img") == 0 and XSS_RECORD in rendered.by_id["alarms"]


def test_workbench_dashboard_writes_the_same_page_offline(served, run_dir, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "pages" / "ptbxl.html"
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboard", "--run", str(run_dir), "--audit-log", str(served.audit), "--out", str(out)])
    assert exit_info.value.code == 0, capsys.readouterr().err
    page = Elements(out.read_text())
    assert page.by_id["summary-requests"] == "5" and page.by_id["head-sha256"] == verify_log(served.audit).head
    assert [path.name for path in out.parent.iterdir()] == ["ptbxl.html"]  # renamed into place, nothing left
    for argv, said in ((["--out", str(run_dir / "page.html")], "inside the run folder"),
                       (["--out", str(tmp_path / "page.txt")], "give a name ending in .html"),
                       (["--out", str(out), "--max-lines", "0"], "--max-lines 0")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main(["dashboard", "--run", str(run_dir), "--audit-log", str(served.audit), *argv])
        assert exit_info.value.code == 2 and said in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboard", "--run", str(run_dir), "--audit-log", str(tmp_path / "none.jsonl"), "--out", str(out)])
    assert exit_info.value.code == 2 and "none.jsonl: no such file" in capsys.readouterr().err
