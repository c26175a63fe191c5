"""Signed heads of the audit log (`workbench.serve.audit_head`): what a hash chain alone cannot prove. A log cut short,
emptied, or rewritten whole with a recomputed chain verifies as a chain, and fails against the heads the server
signed and wrote elsewhere (``workbench audit verify --since-checkpoint`` / ``--expect-head``); a head edited, or
signed by a key this machine does not trust, is refused; a second machine verifies once it trusts the key."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.core import sealkeys
from workbench.serve.audit import AuditLog, verify_log
from workbench.serve.audit_head import Heads, check_heads, read_heads


@pytest.fixture(autouse=True)
def own_trusted_keys(tmp_path, monkeypatch):
    """A configuration folder of this test's own (its trusted-keys file); the session's key signs."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def served(folder, count: int, every: int = 3):
    """An audit log of ``count`` lines whose heads went to a second file every ``every`` lines and at close."""
    log = AuditLog(folder / "audit.jsonl", heads=Heads(folder / "elsewhere" / "heads.jsonl"), checkpoint_every=every)
    for index in range(count):
        log.append({"request_id": f"r{index}", "caller": "ward-7", "outputs": [{"p": 0.1 * index}]})
    log.close()
    return folder / "audit.jsonl", folder / "elsewhere" / "heads.jsonl"


def cli(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_heads_are_written_every_few_lines_and_at_close_and_an_intact_log_holds_them(tmp_path, capsys):
    log, heads_file = served(tmp_path, 7)
    heads = read_heads(heads_file)
    assert [h["seq"] for h in heads] == [0, 3, 6, 7]  # at start, every 3 lines, at close
    lines = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert heads[-1]["head"] == lines[-1]["sha256"] and heads[1]["head"] == lines[2]["sha256"]
    assert check_heads(log, heads, expect_head=lines[4]["sha256"]) == []
    code, out, err = cli(["audit", "verify", log, "--since-checkpoint", heads_file], capsys)
    assert code == 0 and "4 signed head(s)" in out and "seq 7" in out and not err


@pytest.mark.parametrize("damage", ["emptied", "cut", "rewritten"])
def test_a_log_cut_emptied_or_rewritten_verifies_as_a_chain_and_fails_against_its_heads(tmp_path, capsys, damage):
    log, heads_file = served(tmp_path, 7)
    noted = json.loads(log.read_bytes().splitlines()[-1])["sha256"]  # what GET /audit/head said
    if damage == "emptied":
        log.write_bytes(b"")
    elif damage == "cut":  # the last two lines removed: the chain before them is intact
        log.write_bytes(b"".join(line + b"\n" for line in log.read_bytes().splitlines()[:5]))
    else:  # every line rewritten with another caller, and the chain recomputed from the start
        log.unlink()
        forged = AuditLog(log)
        for index in range(7):
            forged.append({"request_id": f"r{index}", "caller": "someone-else", "outputs": [{"p": 0.1 * index}]})
        forged.close()
    assert verify_log(log).ok  # the chain alone cannot tell
    code, _, err = cli(["audit", "verify", log, "--since-checkpoint", heads_file], capsys)
    assert code == 1 and "signed head" in err and "has no intact line with its sha256" in err and "Traceback" not in err
    code, _, err = cli(["audit", "verify", log, "--expect-head", noted], capsys)
    assert code == 1 and f"no intact line has sha256 {noted}" in err


def test_an_edited_head_or_one_signed_by_an_unknown_key_is_refused_until_that_key_is_trusted(tmp_path, monkeypatch):
    log, heads_file = served(tmp_path, 4)
    heads = read_heads(heads_file)
    edited = {**heads[-1], "seq": 3}
    assert "signature does not match" in check_heads(log, [edited])[0]

    with monkeypatch.context() as patch:
        patch.setenv(sealkeys.KEY_ENV, str(tmp_path / "other-site" / "key.pem"))  # another machine's key
        other = Heads(tmp_path / "other-heads.jsonl").write(log.name, heads[-1]["seq"], heads[-1]["head"])
    problems = check_heads(log, [other])
    assert len(problems) == 1 and f"signed by key {other['key_id']}, which this machine does not trust" in problems[0]
    sealkeys.trusted_path().parent.mkdir(parents=True, exist_ok=True)
    sealkeys.trusted_path().write_text(f"other-site {other['public_key']}  # their public key, shared\n")
    assert check_heads(log, [other]) == []


def test_a_head_of_another_log_and_a_malformed_hash_are_refused(tmp_path, capsys):
    log, heads_file = served(tmp_path, 2)
    renamed = tmp_path / "other.jsonl"
    log.rename(renamed)
    assert "signed for the log 'audit.jsonl', not 'other.jsonl'" in check_heads(renamed, read_heads(heads_file))[-1]
    code, _, err = cli(["audit", "verify", renamed, "--expect-head", "abc"], capsys)
    assert code == 2 and "expected a sha256" in err
    code, _, err = cli(["audit", "verify", renamed, "--since-checkpoint", tmp_path / "none.jsonl"], capsys)
    assert code == 2 and "no such file" in err


def test_threads_appending_at_once_sign_each_head_once_and_in_order(tmp_path):
    """Appends that fall due for a head at once claim it under the log's lock: the heads file holds each head once,
    in the order of the log, and every one is a line of it."""
    from concurrent.futures import ThreadPoolExecutor

    log = AuditLog(tmp_path / "audit.jsonl", heads=Heads(tmp_path / "heads.jsonl"), checkpoint_every=2)
    with ThreadPoolExecutor(8) as pool:  # 8 threads, 40 lines each
        list(pool.map(lambda i: log.append({"request_id": f"{i % 8}-{i // 8}"}), range(320)))
    log.close()
    seqs = [head["seq"] for head in read_heads(tmp_path / "heads.jsonl")]
    assert seqs == sorted(set(seqs)) and seqs[-1] == 320 and len(seqs) > 40
    assert check_heads(tmp_path / "audit.jsonl", read_heads(tmp_path / "heads.jsonl")) == []
