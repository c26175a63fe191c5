"""The served model's audit log (`workbench.serve.audit`): every line's own hash and the chain between lines, checked
by `verify_log` and ``workbench audit verify`` against edits, deletions, insertions, moves and a torn last line; an
existing log is continued, a broken one never; one writer at a time; threads do not interleave lines."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading

import pytest

from workbench.cli import main
from workbench.core.errors import UserError
from workbench.serve.audit import FORMAT, GENESIS, AuditLog, verify_log


def written(path, count: int) -> list[bytes]:
    log = AuditLog(path)
    for index in range(count):
        log.append({"request_id": f"r{index}", "outputs": [{"p": 0.25 * index}], "caller": "ward-7"})
    log.close()
    return path.read_bytes().splitlines()


def cli(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_each_line_carries_its_hash_and_the_previous_one(tmp_path):
    lines = [json.loads(line) for line in written(tmp_path / "a.jsonl", 3)]
    assert [line["seq"] for line in lines] == [1, 2, 3] and {line["format"] for line in lines} == {FORMAT}
    assert lines[0]["prev"] == GENESIS
    assert [line["prev"] for line in lines[1:]] == [line["sha256"] for line in lines[:-1]]
    raw = (tmp_path / "a.jsonl").read_bytes().splitlines()[1]
    body = raw[: raw.rindex(b',"sha256"')] + b"}"  # the line without its own hash: hashed independently here
    assert hashlib.sha256(body).hexdigest() == lines[1]["sha256"]
    check = verify_log(tmp_path / "a.jsonl")
    assert check.ok and check.lines == 3 and check.head == lines[2]["sha256"]


@pytest.mark.parametrize(
    "damage, bad_line",
    [
        (lambda lines: [lines[0], lines[1].replace(b"ward-7", b"ward-8"), *lines[2:]], 2),  # an edited line
        (lambda lines: [lines[0], *lines[2:]], 2),  # a deleted line: its successor no longer links
        (lambda lines: [lines[0], lines[2], lines[1], *lines[3:]], 2),  # two lines swapped
        (lambda lines: [*lines[:2], lines[1], *lines[2:]], 3),  # a line repeated
        (lambda lines: lines[1:], 1),  # the first line deleted: the next does not start from the genesis value
    ],
    ids=["edited", "deleted", "swapped", "repeated", "first-deleted"],
)
def test_a_damaged_log_names_its_first_bad_line(tmp_path, capsys, damage, bad_line):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(damage(written(path, 5))) + b"\n")
    check = verify_log(path)
    assert not check.ok and check.bad_line == bad_line and check.lines == bad_line - 1
    code, out, err = cli(["audit", "verify", path], capsys)
    assert code == 1 and f"line {bad_line}:" in err and "Traceback" not in err and not out


def test_an_edit_that_recomputes_the_line_hash_is_caught_by_the_next_line(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = written(path, 3)
    entry = json.loads(lines[1])
    entry["caller"] = "someone-else"
    del entry["sha256"]
    body = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    forged = body[:-1] + f',"sha256":"{hashlib.sha256(body).hexdigest()}"}}'.encode()
    path.write_bytes(b"\n".join([lines[0], forged, lines[2]]) + b"\n")
    check = verify_log(path)
    assert check.bad_line == 3 and "prev" in check.problem


def test_an_intact_log_verifies_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "a.jsonl"
    lines = written(path, 4)
    code, out, err = cli(["audit", "verify", path], capsys)
    assert code == 0 and out.startswith("ok: ") and "4 line(s)" in out and json.loads(lines[-1])["sha256"] in out
    code, _, err = cli(["audit", "verify", tmp_path / "missing.jsonl"], capsys)
    assert code == 2 and "no such file" in err


def test_a_torn_last_line_is_quarantined_and_the_chain_continues(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = written(path, 3)
    path.write_bytes(b"\n".join(lines) + b"\n" + lines[2][:40])
    check = verify_log(path)
    assert check.bad_line == 4 and "incomplete" in check.problem and check.lines == 3 and check.torn_last_line
    log = AuditLog(path)
    log.append({"request_id": "after"})
    log.close()
    entries = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert verify_log(path).ok and [e["seq"] for e in entries] == [1, 2, 3, 4, 5]
    record = entries[3]
    assert record["event"] == "quarantined_torn_line" and record["torn_bytes"] == 40
    evidence = tmp_path / record["quarantine_file"]
    assert evidence.read_bytes() == lines[2][:40]  # the torn bytes kept, byte for byte
    assert record["torn_sha256"] == hashlib.sha256(lines[2][:40]).hexdigest()
    assert (evidence.stat().st_mode & 0o777) == 0o600


def test_an_edited_line_before_the_end_is_still_never_continued(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = written(path, 3)
    path.write_bytes(b"\n".join([lines[0], lines[1].replace(b"ward-7", b"ward-9"), lines[2]]) + b"\n" + b"torn")
    with pytest.raises(UserError, match="line 2: .*never continued"):
        AuditLog(path)


_FULL_DISK = """
import json, os, resource, sys
from workbench.serve.audit import AuditLog
path, limit = sys.argv[1], int(sys.argv[2])
log = AuditLog(path)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # the kernel refuses bytes past `limit`: a full disk
answered, errors = 0, []
for index in range(20):
    try:
        log.append({"request_id": f"r{index}", "outputs": [{"p": 0.5}]})
        answered += 1
    except OSError as error:
        errors.append(str(error))
print(json.dumps({"answered": answered, "errors": errors, "failure": log.failure}))
"""


def test_a_full_disk_leaves_a_torn_line_that_a_restart_quarantines(tmp_path):
    """The kernel cuts a line short at the file size limit (RLIMIT_FSIZE: what a full disk does to a write); the
    log then refuses every append with one reason; a restart keeps the torn bytes apart and continues the chain."""
    path = tmp_path / "a.jsonl"
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(path), "700"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    outcome = json.loads(done.stdout)
    assert outcome["answered"] >= 1 and len(outcome["errors"]) == 20 - outcome["answered"]
    assert "cannot be written" in outcome["failure"] and all("earlier write failed" in e for e in outcome["errors"][1:])
    assert path.stat().st_size == 700 and not path.read_bytes().endswith(b"\n")  # a torn last line
    log = AuditLog(path)
    log.append({"request_id": "after-restart"})
    log.close()
    entries = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert verify_log(path).ok and len(entries) == outcome["answered"] + 2
    assert entries[-2]["event"] == "quarantined_torn_line" and entries[-1]["request_id"] == "after-restart"


def test_an_existing_log_is_continued_after_its_last_line(tmp_path):
    path = tmp_path / "a.jsonl"
    first = written(path, 2)
    log = AuditLog(path)
    entry = log.append({"request_id": "later"})
    log.close()
    assert entry["seq"] == 3 and entry["prev"] == json.loads(first[-1])["sha256"]
    assert verify_log(path).lines == 3


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    with pytest.raises(UserError, match="another process"):
        AuditLog(path)
    log.close()
    AuditLog(path).close()  # free again once the first is closed


def test_threads_appending_at_once_keep_one_chain(tmp_path):
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)

    def append(worker: int) -> None:
        for index in range(25):
            log.append({"request_id": f"{worker}-{index}"})

    threads = [threading.Thread(target=append, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    check = verify_log(path)
    assert check.ok and check.lines == 200
    ids = [json.loads(line)["request_id"] for line in path.read_bytes().splitlines()]
    assert sorted(ids) == sorted(f"{w}-{i}" for w in range(8) for i in range(25))
    assert (path.stat().st_mode & 0o777) == 0o600
