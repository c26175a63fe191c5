"""The one bad-record collector of the signal readers (`workbench.core.records.Collector`): what it skips, under which
file, what it raises, and that the ECG and EEG readers both keep their records through it."""

from __future__ import annotations

import logging

import pytest

from workbench.core.errors import UserError
from workbench.core.paths import PathOutsideData
from workbench.core.records import BadRecordError, Collector


def _read(collector: Collector, path: str, error: Exception | None, where: str = "") -> bool:
    """Run one record through ``collector``; True when the body ran to its end."""
    done = False
    with collector.record(path, where=where):
        if error is not None:
            raise error
        done = True
    return done


def test_a_good_record_is_counted_and_nothing_is_skipped():
    collector = Collector("skip")
    assert _read(collector, "a.edf", None) and _read(collector, "b.edf", None)
    assert collector.skipped.seen == 2 and len(collector.skipped) == 0


def test_skip_lists_the_record_under_the_path_read_and_warns(caplog):
    collector = Collector("skip")
    with caplog.at_level(logging.WARNING, logger="workbench.core.records"):
        assert not _read(collector, "night/psg.edf", BadRecordError("night/hyp.edf", "not the same night"))
        assert not _read(collector, "b.edf", UserError("b.edf: channel C3 missing"))  # the path prefix is dropped
    assert [(p.record, p.problem) for p in collector.skipped] == [
        ("night/psg.edf", "not the same night"),
        ("b.edf", "channel C3 missing"),
    ]
    assert collector.skipped.headline() == "2 of 2 record(s) skipped"
    assert "skipping night/psg.edf: not the same night" in caplog.text
    assert "skipping b.edf: channel C3 missing" in caplog.text


def test_report_by_file_lists_the_file_the_problem_names_with_where():
    collector = Collector("skip", report_by="file")
    _read(collector, "records100/00001_lr", BadRecordError("records100/00001_lr.dat", "truncated"), where="ecg_id 1")
    [problem] = collector.skipped
    assert (problem.record, problem.problem) == ("records100/00001_lr.dat", "truncated (ecg_id 1)")


def test_raise_stops_at_the_first_bad_record_with_its_text():
    error = BadRecordError("x.hea", "checksum")
    with pytest.raises(BadRecordError) as raised:
        _read(Collector("raise"), "x", error)
    assert raised.value is error
    with pytest.raises(BadRecordError, match=r"^x\.hea: checksum \(ecg_id 7, filename_lr\)$") as raised:
        _read(Collector("raise", report_by="file"), "x", error, where="ecg_id 7, filename_lr")
    assert raised.value.record == "x.hea" and raised.value.problem == "checksum (ecg_id 7, filename_lr)"


def test_a_path_outside_the_data_and_a_bug_are_never_skipped():
    collector = Collector("skip")
    with pytest.raises(PathOutsideData):
        _read(collector, "a.hea", PathOutsideData("a.hea: names '../x.dat'"))
    with pytest.raises(ZeroDivisionError):
        _read(collector, "b.hea", ZeroDivisionError("a bug, not a bad record"))
    assert len(collector.skipped) == 0 and collector.skipped.seen == 2


def test_the_ecg_and_eeg_readers_collect_through_it():
    pytest.importorskip("wfdb")
    from workbench.domains.ecg.ecg_set import PreparedRecords
    from workbench.domains.eeg.readers import WindowCollector

    assert issubclass(PreparedRecords, Collector) and issubclass(WindowCollector, Collector)
    assert PreparedRecords.record is WindowCollector.record is Collector.record
