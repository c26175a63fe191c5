"""The monitoring page of a served model: one self-contained HTML page built from its audit log
(`workbench.serve.audit`) and the predictor's ``describe()``, served at ``GET /dashboard`` and written offline by
``workbench dashboard``.

Self-contained: inline CSS, plots as inline SVG (`workbench.serve.plots`), no script and no address of any kind
(the page's ``Content-Security-Policy``, `HEADERS`, forbids loading anything); every text from the log (callers,
records, refusal messages) and from the run is HTML-escaped. What it shows:

- requests per time bin (1 s to 1 week, the smallest width that spans the lines read in at most 60 bins; UTC),
  stacked by HTTP status;
- the shift alarm's p-value of every request that got one (log scale), the alarm's level α as a line, alarms
  (verdict "shift") in red;
- per bin: the mean conformal set size, and the shares of empty sets and of sets holding every class;
- a histogram of each scored item's top calibrated probability (the largest over classes);
- the audit head (``seq`` and ``sha256`` of the last complete line: what ``GET /audit/head`` answers for the same
  line) and whether the lines read link up into a hash chain;
- the run's card summary: task, method, seal state, temperatures and ECE, conformal level and its test coverage, the
  shift test, the intended use's first lines.

The log is read as it is being appended to: from its end, at most ``max_lines`` complete lines (`MAX_LINES` by
default, and at most `MAX_BYTES`; the page says when earlier lines were left out); bytes after the last newline (a
line being written, or a torn last line) are ignored, and a line that is not JSON is counted, not shown.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from workbench.core.errors import UserError
from workbench.serve.audit import GENESIS, _line_problem
from workbench.serve.plots import Bins, duration, histogram, requests_plot, set_plots, shift_plot
from workbench.serve.plots import escaped as _e

#: Most lines read from the end of the log.
MAX_LINES = 20_000
#: Most bytes read from the end of the log (lines past it are left out as past `MAX_LINES`).
MAX_BYTES = 256 * 2**20
#: Rows of the "recent" tables.
RECENT = 10
#: What the page may load and run: nothing but its own inline style (also in the page, for a saved copy).
POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
#: HTTP headers of the served page: `POLICY`, and no framing, no caching, no referrer.
HEADERS = {
    "Content-Security-Policy": f"{POLICY}; frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_BLOCK = 1 << 20


@dataclass(frozen=True)
class Tail:
    """The last lines of an audit log, as `read_tail` found them.

    ``requests``: the request lines (parsed, oldest first); ``events``: other lines (a quarantined torn line);
    ``lines_read``: complete lines read; ``left_out``: whether earlier lines exist that were not read; ``seq`` and
    ``head``: the last complete line's ``seq`` and ``sha256`` (0 and `GENESIS` for an empty log); ``unreadable``:
    lines that are not JSON objects; ``chain_problem``: the first line of those read that fails its own hash or does
    not link to the one before (None when all link up); ``incomplete_end``: bytes after the last newline."""

    requests: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    lines_read: int = 0
    left_out: bool = False
    seq: int = 0
    head: str = GENESIS
    unreadable: int = 0
    chain_problem: str | None = None
    incomplete_end: int = 0


def read_tail(path: str | Path, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> Tail:
    """The last ``max_lines`` complete lines of the audit log ``path`` (module docstring), read from its end without
    reading more than ``max_bytes`` (plus one block); safe while a server appends to it.

    Raises:
        UserError: ``path`` is not a readable file, or ``max_lines`` is not positive.
    """
    path = Path(path)
    if max_lines < 1:
        raise UserError(f"--max-lines {max_lines}: expected a positive number of lines")
    if not path.is_file():
        raise UserError(f"--audit-log {path}: no such file (give the log workbench serve --audit-log writes)")
    with open(path, "rb") as handle:
        end = handle.seek(0, os.SEEK_END)  # what was written by now: later lines are not read
        start, blocks, newlines = end, [], 0
        while start > 0 and newlines <= max_lines and end - start < max_bytes:
            size = min(_BLOCK, start)
            start -= size
            handle.seek(start)
            blocks.append(handle.read(size))
            newlines += blocks[-1].count(b"\n")
    content = b"".join(reversed(blocks))
    complete, _, rest = content.rpartition(b"\n")
    raw_lines = complete.split(b"\n") if complete else []
    if start > 0 and raw_lines:
        raw_lines = raw_lines[1:]  # the first piece starts inside a line
    left_out = start > 0 or len(raw_lines) > max_lines
    raw_lines = raw_lines[-max_lines:]
    requests, events, unreadable = [], [], 0
    seq, head, problem, expected = 0, GENESIS, None, None
    for raw in raw_lines:
        try:
            entry = json.loads(raw)
        except ValueError:
            entry = None
        if not isinstance(entry, dict):
            unreadable += 1
            problem = problem or f"a line after seq {seq}: not a JSON object"
            continue
        if expected is None:  # the first line read: checked against the log's start when it is the first line
            expected = (entry.get("seq"), entry.get("prev")) if left_out else (1, GENESIS)
        found = _line_problem(raw, *expected, entry=entry)
        if found and problem is None:
            problem = f"line seq {entry.get('seq')}: {found}"
        seq, head = entry.get("seq", seq), entry.get("sha256", head)
        expected = (seq + 1 if isinstance(seq, int) else None, head)
        (events if "event" in entry else requests).append(entry)
    return Tail(requests, events, len(raw_lines), left_out, seq, head, unreadable, problem, len(rest))


def page(log: str | Path, description: Mapping[str, Any], *, max_lines: int = MAX_LINES, alpha: float | None = None,
         built: datetime | None = None) -> str:  # fmt: skip
    """The monitoring page (HTML text) of the audit log ``log`` and the predictor's ``description`` (its
    ``describe()``), from the log's last ``max_lines`` lines; ``alpha``: the shift alarm's level (default
    `workbench.clinical.shift_alarm.ALPHA`); ``built``: the time stated on the page (default now)."""
    return render(read_tail(log, max_lines), description, log_name=Path(log).name, max_lines=max_lines,
                  alpha=alpha, built=built)  # fmt: skip


def write_page(run: str | Path, audit_log: str | Path, out: str | Path, *, max_lines: int = MAX_LINES,
               trust_modified: bool = False, device: str = "auto") -> Path:  # fmt: skip
    """``workbench dashboard``: the page of ``audit_log`` and the finished run ``run`` (loaded on ``device``,
    `workbench.core.device.resolve`; verified against its seal unless ``trust_modified``), written atomically to
    ``out``; returns ``out``.

    Raises:
        UserError: ``out`` is not an ``.html`` file or lies inside a run folder; the log or the run cannot be read.
    """
    from workbench.clinical.predictor import ClinicalPredictor
    from workbench.core.checkpoint import write_text
    from workbench.core.seal import run_folder_above

    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {out}: the page is an HTML file: give a name ending in .html")
    inside = run_folder_above(out.parent)
    if inside is not None:
        raise UserError(f"--out {out}: inside the run folder {inside}; nothing is written into a run folder: choose "
                        "an --out outside it")  # fmt: skip
    tail = read_tail(audit_log, max_lines)  # a missing log or a bad --max-lines is refused before the model loads
    description = ClinicalPredictor.load(run, trust_modified=trust_modified, device=device).describe()
    write_text(out, render(tail, description, log_name=Path(audit_log).name, max_lines=max_lines))
    return out


# --- what the lines say ---------------------------------------------------------------------------------------------


def _time(entry: Mapping[str, Any]) -> float | None:
    """The entry's ``time`` as POSIX seconds, None when absent or not an ISO time."""
    try:
        moment = datetime.fromisoformat(str(entry.get("time")))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def _scored(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The entry's outputs that were scored (status ok, with probabilities)."""
    return [output for output in entry.get("outputs") or () if isinstance(output, dict) and
            output.get("status") == "ok" and isinstance(output.get("probabilities"), dict) and output["probabilities"]]


def _records(entry: Mapping[str, Any]) -> list[str]:
    """The records the entry's outputs name, each once, in order."""
    return list(dict.fromkeys(str(o.get("record")) for o in entry.get("outputs") or () if isinstance(o, dict)))


def _table(rows: Iterable[tuple[str, str]], table_id: str) -> str:
    """A two-column table of (label, HTML) rows; each value cell's id is ``table_id``-``label`` slug."""
    body = "".join(f'<tr><th>{_e(label)}</th><td id="{table_id}-{_slug(label)}">{value}</td></tr>'
                   for label, value in rows)  # fmt: skip
    return f'<table class="facts" id="{table_id}">{body}</table>'


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _list_table(headers: list[str], rows: list[list[str]], table_id: str, empty: str) -> str:
    """A table of already-escaped cells, or ``empty`` (a sentence) when there is no row."""
    if not rows:
        return f'<p class="none" id="{table_id}">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="list" id="{table_id}"><tr>{head}</tr>{body}</table>'


def _card(description: Mapping[str, Any]) -> str:
    """The run's card summary from ``describe()``."""
    seal = description.get("run_seal") or {}
    seal_text = _e(seal.get("status", "unknown")) + "".join(f"; {_e(p)}" for p in seal.get("problems", []))
    rows = [("task", _e(description.get("task"))), ("method", _e(description.get("method"))),
            ("adapter sha256", f"<code>{_e(description.get('adapter_sha256'))}</code>"),
            ("workbench version", _e(description.get("workbench_version"))), ("run folder", _e(description.get("run"))),
            ("seal", seal_text)]  # fmt: skip
    calibration, conformal, shift = (description.get(k) for k in ("calibration", "conformal", "shift"))
    if calibration:
        temperatures = ", ".join(f"{t:.3g}" for t in calibration.get("temperatures") or [])
        rows += [("temperatures", _e(temperatures)),
                 ("ECE before → after", _e(f"{calibration.get('ece_before', float('nan')):.3f} → "
                                          f"{calibration.get('ece_after', float('nan')):.3f} over "
                                          f"{calibration.get('ece_items')} items"))]  # fmt: skip
    else:
        rows.append(("calibration", "not fitted (the run has no clinical layer): probabilities are uncalibrated"))
    if conformal:
        coverage = conformal.get("empirical_coverage")
        rows += [("conformal level", _e(f"{1 - conformal['alpha']:.2f} (α = {conformal['alpha']:g}); "
                                        f"{conformal.get('kind')}")),
                 ("test coverage", _e(f"{coverage:.3f} over {conformal.get('coverage_items')} test items; mean set "
                                      f"size {conformal.get('mean_set_size', float('nan')):.2f}; "
                                      f"{conformal.get('calibration_size')} calibration items")
                  if coverage is not None else "—")]  # fmt: skip
    if shift:
        rows.append(("shift test", _e(f"{shift.get('test')}; reference of {shift.get('reference_size')} items, "
                                      f"window {shift.get('window')}")))  # fmt: skip
    intended = description.get("intended_use")
    lines = [line for line in (intended or "").splitlines() if line.strip()][:5]
    rows.append(("intended use", "<br>".join(_e(line) for line in lines) if lines else
                 "not written (the run has no intended_use.md)"))  # fmt: skip
    return _table(rows, "card")


def _when(seconds: float | None) -> str:
    return "—" if seconds is None else f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def render(tail: Tail, description: Mapping[str, Any], *, log_name: str, max_lines: int = MAX_LINES,
           alpha: float | None = None, built: datetime | None = None) -> str:  # fmt: skip
    """The page (HTML text) of ``tail`` (read with ``max_lines``) and ``description`` (module docstring); ``alpha``
    and ``built`` as for `page`."""
    if alpha is None:
        from workbench.clinical.shift_alarm import ALPHA as alpha
    built = built or datetime.now(timezone.utc)
    requests = tail.requests
    timed = sorted(((t, e) for e in requests if (t := _time(e)) is not None), key=lambda pair: pair[0])
    answered = sum(entry.get("http_status") == 200 for entry in requests)
    scored = [(seconds, output) for seconds, entry in timed for output in _scored(entry)]
    shifts = [(seconds, entry) for seconds, entry in timed
              if isinstance(entry.get("shift"), dict) and isinstance(entry["shift"].get("p_value"), (int, float))]
    alarms = [(seconds, entry) for seconds, entry in shifts if entry["shift"].get("verdict") == "shift"]
    summary = [("requests", f"{len(requests):,}"), ("answered", f"{answered:,}"),
               ("refused", f"{len(requests) - answered:,}"), ("items scored", f"{len(scored):,}"),
               ("shift verdicts", f"{len(shifts):,}"), ("shift alarms", f"{len(alarms):,}"),
               ("callers", f"{len({str(e.get('caller')) for e in requests}):,}"),
               ("first request", _when(timed[0][0] if timed else None)),
               ("last request", _when(timed[-1][0] if timed else None))]  # fmt: skip
    chain = ("the lines read link up (each line's own hash and its link to the one before); the whole log: "
             "workbench audit verify" if tail.chain_problem is None else f"BROKEN: {_e(tail.chain_problem)}")
    head = _table([("log", _e(log_name)), ("seq", str(tail.seq)), ("sha256", f"<code>{_e(tail.head)}</code>"),
                   ("hash chain", chain)], "head")  # fmt: skip
    if requests:
        sections = _plots(timed, scored, shifts, alarms, alpha) + _activity(timed, alarms)
    else:
        sections = ['<p class="empty" id="no-requests">No requests yet: the audit log holds no request line.</p>']
    notes = "".join(f" {_e(note)}." for note in _notes(tail, description, max_lines))
    title = f"workbench monitoring: {description.get('task')} · {description.get('method')}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_e(POLICY)}">
<meta name="referrer" content="no-referrer">
<title>{_e(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{_e(title)}</h1>
<p class="note" id="built">Built {_e(f"{built:%Y-%m-%d %H:%M:%S %Z}")} by workbench
{_e(description.get("workbench_version"))} from the audit log <code>{_e(log_name)}</code>.{notes}</p>
<div class="columns">
<section><h2>Requests</h2>{_table(summary, "summary")}</section>
<section><h2>Audit head</h2>{head}<p class="note">The same <code>seq</code> and <code>sha256</code> as
<code>GET /audit/head</code> answers for this line: keep them elsewhere to check the log later
(<code>workbench audit verify LOG --expect-head SHA256</code>).</p></section>
<section><h2>The model</h2>{_card(description)}</section>
</div>
{"".join(sections)}
</body></html>
"""


def _notes(tail: Tail, description: Mapping[str, Any], max_lines: int) -> list[str]:
    """Sentences on what was read: how much of the log, what was left out, lines of another model, events."""
    if tail.left_out:
        notes = [f"It shows the last {tail.lines_read:,} lines: earlier lines were not read (at most {max_lines:,} "
                 f"lines and {MAX_BYTES // 2**20} MiB from the end)"]  # fmt: skip
    else:
        notes = [f"It shows all {tail.lines_read:,} lines"]
    if tail.incomplete_end:
        notes.append(f"{tail.incomplete_end} bytes after the last complete line were not read (a line being written, "
                     "or a torn line that the next start quarantines)")  # fmt: skip
    if tail.unreadable:
        notes.append(f"{tail.unreadable} line(s) are not JSON objects and are not shown")
    adapter = description.get("adapter_sha256")
    other = sum((e.get("model") or {}).get("adapter_sha256") not in (None, adapter) for e in tail.requests)
    if other:
        notes.append(f"{other} request(s) were answered by another model than this run's (adapter sha256 "
                     f"{adapter}): the log and the run do not belong together")  # fmt: skip
    for event in tail.events:
        notes.append(f"Line seq {event.get('seq')}: {event.get('event')} at {event.get('time')} "
                     f"({event.get('torn_bytes')} bytes kept in {event.get('quarantine_file')})")  # fmt: skip
    return notes


def _plots(timed: list[tuple[float, dict]], scored: list[tuple[float, dict]], shifts: list[tuple[float, dict]],
           alarms: list[tuple[float, dict]], alpha: float) -> list[str]:  # fmt: skip
    """The plot sections: requests, shift p-values and conformal sets over time, the top-probability histogram."""
    sections = []
    if not timed:
        sections.append('<p class="none">No request line has a readable time: nothing to plot over time.</p>')
    else:
        bins = Bins.over([t for t, _ in timed])
        svg, legend = requests_plot(timed, bins)
        sections.append(_figure("Requests over time", svg, f"Requests per {duration(bins.width)} (UTC), stacked "
                                f"by HTTP status. {legend}"))  # fmt: skip
        x_range = (bins.start, bins.start + bins.count * bins.width)
        if shifts:
            text = (f"The shift alarm's p-value of each request (its batch with the caller's window of earlier items, "
                    f"against the run's reference); red: an alarm (p ≤ α = {alpha:g}), {len(alarms)} of "
                    f"{len(shifts)}.")  # fmt: skip
            sections.append(_figure("Shift p-values", shift_plot(shifts, x_range, bins.ticks(), alpha), text))
        else:
            sections.append(_none("Shift p-values", "no request has a shift p-value yet (too few items, or the run "
                                  "has no shift reference)"))  # fmt: skip
        sets = [(seconds, len(output["conformal_set"]), len(output["probabilities"])) for seconds, output in scored
                if isinstance(output.get("conformal_set"), list)]  # fmt: skip
        if sets:
            classes = max(n for _, _, n in sets)
            sizes, shares = set_plots(sets, bins, classes)
            empty, full = sum(s == 0 for _, s, _ in sets), sum(s == n for _, s, n in sets)
            sections.append(_figure("Conformal set sizes", sizes, f"The mean conformal set size per bin of the "
                                    f"{len(sets):,} scored items with a set (out of {classes} classes)."))
            text = (f"Per bin, the share of empty sets (red; {empty} in all, {empty / len(sets):.1%}) and of sets "
                    f"holding every class (grey; {full} in all, {full / len(sets):.1%}).")  # fmt: skip
            sections.append(_figure("Empty and all-classes sets", shares, text))
        else:
            sections.append(_none("Conformal set sizes", "no scored item has a conformal set yet"))
    tops = [max(float(v) for v in output["probabilities"].values()) for _, output in scored]
    if tops:
        text = (f"The top calibrated probability (the largest over classes) of each of the {len(tops):,} scored items, "
                "in 20 bins.")  # fmt: skip
        sections.append(_figure("Calibrated top-class probabilities", histogram(tops), text))
    else:
        sections.append(_none("Calibrated top-class probabilities", "no item was scored yet"))
    return sections


def _activity(timed: list[tuple[float, dict]], alarms: list[tuple[float, dict]]) -> list[str]:
    """The tables of callers, the last refusals and the last shift alarms (every cell escaped)."""
    callers: dict[str, Counter] = {}
    last_seen: dict[str, float] = {}
    for seconds, entry in timed:
        caller = str(entry.get("caller"))
        counts = callers.setdefault(caller, Counter())
        counts["requests"] += 1
        counts["refused"] += entry.get("http_status") != 200
        shift = entry.get("shift")
        counts["alarms"] += isinstance(shift, dict) and shift.get("verdict") == "shift"
        last_seen[caller] = seconds
    caller_rows = [[_e(c), str(n["requests"]), str(n["refused"]), str(n["alarms"]), _e(_when(last_seen[c]))]
                   for c, n in sorted(callers.items())]  # fmt: skip
    refused = [(s, e) for s, e in timed if e.get("http_status") != 200][-RECENT:][::-1]
    refused_rows = [[_e(_when(s)), _e(e.get("caller")), _e(e.get("http_status")), _e(e.get("detail"))]
                    for s, e in refused]  # fmt: skip
    alarm_rows = [[_e(_when(s)), _e(e.get("caller")), _e(", ".join(_records(e))), _e(f"{e['shift']['p_value']:.4g}"),
                   _e(e["shift"].get("window"))] for s, e in alarms[-RECENT:][::-1]]  # fmt: skip
    return [
        "<h2>Callers</h2>" + _list_table(["caller", "requests", "refused", "shift alarms", "last request"],
                                         caller_rows, "callers", "No caller."),
        f"<h2>Last refusals (at most {RECENT})</h2>" + _list_table(["time", "caller", "status", "detail"],
                                                                  refused_rows, "refusals", "No request was refused."),
        f"<h2>Last shift alarms (at most {RECENT})</h2>" + _list_table(
            ["time", "caller", "records", "p-value", "items tested (batch and window)"], alarm_rows, "alarms",
            "No shift alarm."),
    ]  # fmt: skip


def _figure(title: str, svg: str, caption: str) -> str:
    """A plot section; ``caption`` is HTML (escaped by the caller)."""
    return f'<section class="plot"><h2>{_e(title)}</h2>{svg}<p class="caption">{caption}</p></section>'


def _none(title: str, why: str) -> str:
    return f'<section class="plot"><h2>{_e(title)}</h2><p class="none">Nothing to plot: {_e(why)}.</p></section>'


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#212121;max-width:1320px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:16px;margin:18px 0 6px}
.note,.caption{color:#555;font-size:13px}.none,.empty{color:#555;font-style:italic}
.columns{display:flex;flex-wrap:wrap;gap:24px}.columns section{flex:1 1 360px;min-width:320px}
table{border-collapse:collapse;font-size:13px}th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #e0e0e0;
vertical-align:top}table.facts th{color:#555;font-weight:600;white-space:nowrap}
code{font-size:12px;overflow-wrap:anywhere}
section.plot{display:inline-block;vertical-align:top;margin-right:24px;max-width:600px}
svg.plot{background:#fff;display:block}svg .frame{fill:#fafafa;stroke:#bdbdbd}svg .grid{stroke:#eeeeee}
svg .axis{stroke:#9e9e9e}svg text{font-size:11px;fill:#424242}svg .label{font-size:12px;fill:#212121}
.key{white-space:nowrap;margin-right:10px}.key i{display:inline-block;width:10px;height:10px;margin-right:4px}
"""
