"""The plots of the monitoring page (`workbench.serve.dashboard`), drawn as inline SVG text: no library, no script,
no address. A `Chart` maps data coordinates into a fixed box with ticks and labels; each element carries a
``<title>`` (the browser's tooltip). Plots over time share `Bins`: the smallest of `BIN_WIDTHS` that spans the times
in at most `MAX_BINS` bins, UTC."""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

#: Most time bins of the plots over time.
MAX_BINS = 60
#: Bin widths tried, smallest first [s].
BIN_WIDTHS = (1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400)
_STATUS_COLOURS = {2: "#2e7d32", 4: "#ef6c00", 5: "#c62828"}
_MORE_4XX = ("#ef6c00", "#f9a825", "#8d6e63", "#ad1457", "#6a1b9a", "#00838f")


def _bin_width(span_s: float) -> int:
    """The smallest of `BIN_WIDTHS` [s] that covers ``span_s`` in at most `MAX_BINS` bins."""
    return next((width for width in BIN_WIDTHS if span_s / width < MAX_BINS), BIN_WIDTHS[-1])


def _clock(seconds: float, width: int) -> str:
    """A bin's start as text at the bin width's resolution (UTC)."""
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    if width < 60:
        return moment.strftime("%H:%M:%S")
    if width < 86400:
        return moment.strftime("%m-%d %H:%M")
    return moment.strftime("%Y-%m-%d")


def duration(width: int) -> str:
    """A bin width [s] in words: ``10 s``, ``1 h``, ``1 week``."""
    for unit, size in (("week", 7 * 86400), ("day", 86400), ("h", 3600), ("min", 60)):
        if width >= size:
            return f"{width // size} {unit}"
    return f"{width} s"


# --- SVG ------------------------------------------------------------------------------------------------------------


def escaped(value: Any) -> str:
    """``value`` as HTML-escaped text (quotes too)."""
    return html.escape(str(value), quote=True)


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values spanning [``low``, ``high``]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _number(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.0e}"


class Chart:
    """An SVG plot: data coordinates ``x_range`` × ``y_range`` (``log_y``: log10 of y) drawn into a fixed box;
    ``x_ticks`` and ``y_ticks`` are ``(value, label)`` pairs."""

    width, height, left, right, top, bottom = 580, 220, 54, 26, 12, 40

    def __init__(self, name: str, x_range: tuple[float, float], y_range: tuple[float, float],
                 x_ticks: Iterable[tuple[float, str]], y_ticks: Iterable[tuple[float, str]], x_label: str,
                 y_label: str, log_y: bool = False):  # fmt: skip
        self.name, self.log_y = name, log_y
        self.x0, self.x1 = x_range
        self.y0, self.y1 = (math.log10(v) for v in y_range) if log_y else y_range
        self.parts: list[str] = []
        box_w, box_h = self.width - self.left - self.right, self.height - self.top - self.bottom
        self.parts.append(f'<rect class="frame" x="{self.left}" y="{self.top}" width="{box_w}" height="{box_h}"/>')
        for value, label in y_ticks:
            y = self.y(value)
            self.parts.append(f'<line class="grid" x1="{self.left}" x2="{self.width - self.right}" y1="{y:.1f}" '
                              f'y2="{y:.1f}"/><text class="tick" x="{self.left - 4}" y="{y + 3:.1f}" '
                              f'text-anchor="end">{escaped(label)}</text>')  # fmt: skip
        for value, label in x_ticks:
            x = self.x(value)
            self.parts.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{self.height - self.bottom}" '
                              f'y2="{self.height - self.bottom + 4}"/><text class="tick" x="{x:.1f}" '
                              f'y="{self.height - self.bottom + 15}" text-anchor="middle">{escaped(label)}</text>')
        self.parts.append(f'<text class="label" x="{self.left + box_w / 2:.0f}" y="{self.height - 6}" '
                          f'text-anchor="middle">{escaped(x_label)}</text><text class="label" transform="translate(12,'
                          f'{self.top + box_h / 2:.0f}) rotate(-90)" text-anchor="middle">{escaped(y_label)}</text>')

    def x(self, value: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (value - self.x0) / span * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        value = math.log10(value) if self.log_y else value
        span = (self.y1 - self.y0) or 1.0
        return self.height - self.bottom - (value - self.y0) / span * (self.height - self.top - self.bottom)

    def bar(self, x0: float, x1: float, y0: float, y1: float, colour: str, tip: str) -> None:
        left, right, low, high = self.x(x0), self.x(x1), self.y(y0), self.y(y1)
        self.parts.append(f'<rect class="bar" x="{left:.1f}" y="{high:.1f}" width="{max(right - left - 1, 1):.1f}" '
                          f'height="{max(low - high, 0):.1f}" fill="{colour}"><title>{escaped(tip)}</title></rect>')

    def point(self, x: float, y: float, colour: str, tip: str, kind: str = "point") -> None:
        self.parts.append(f'<circle class="{kind}" cx="{self.x(x):.1f}" cy="{self.y(y):.1f}" r="3.2" '
                          f'fill="{colour}"><title>{escaped(tip)}</title></circle>')

    def line(self, points: list[tuple[float, float]], colour: str, kind: str) -> None:
        text = " ".join(f"{self.x(x):.1f},{self.y(y):.1f}" for x, y in points)
        self.parts.append(f'<polyline class="{kind}" points="{text}" fill="none" stroke="{colour}" '
                          'stroke-width="1.6"/>')

    def level(self, y: float, colour: str, label: str) -> None:
        at = self.y(y)
        self.parts.append(f'<line class="level" x1="{self.left}" x2="{self.width - self.right}" y1="{at:.1f}" '
                          f'y2="{at:.1f}" stroke="{colour}" stroke-dasharray="5 3"/><text class="tick" '
                          f'x="{self.width - self.right - 4}" y="{at - 4:.1f}" text-anchor="end" '
                          f'fill="{colour}">{escaped(label)}</text>')  # fmt: skip

    def svg(self) -> str:
        return (f'<svg class="plot" id="plot-{self.name}" role="img" viewBox="0 0 {self.width} {self.height}" '
                f'width="{self.width}" height="{self.height}">{"".join(self.parts)}</svg>')


@dataclass
class Bins:
    """Time bins of ``width`` seconds from ``start`` (UTC), ``count`` of them."""

    start: float
    width: int
    count: int

    @classmethod
    def over(cls, times: list[float]) -> "Bins":
        low, high = min(times), max(times)
        width = _bin_width(high - low)
        start = math.floor(low / width) * width
        return cls(start, width, int((high - start) // width) + 1)

    def index(self, seconds: float) -> int:
        return min(int((seconds - self.start) // self.width), self.count - 1)

    def ticks(self) -> list[tuple[float, str]]:
        step = max(1, math.ceil(self.count / 6))
        return [(self.start + i * self.width, _clock(self.start + i * self.width, self.width))
                for i in range(0, self.count + 1, step)]  # fmt: skip


def _status_colour(status: Any, order: list[Any]) -> str:
    if isinstance(status, int) and status // 100 == 4 and status != 400:
        return _MORE_4XX[order.index(status) % len(_MORE_4XX)]
    return _STATUS_COLOURS.get(status // 100 if isinstance(status, int) else 0, "#757575")


def requests_plot(timed: list[tuple[float, dict[str, Any]]], bins: Bins) -> tuple[str, str]:
    """(the SVG of requests per bin stacked by status, its legend)."""
    counts = [Counter() for _ in range(bins.count)]
    for seconds, entry in timed:
        counts[bins.index(seconds)][entry.get("http_status")] += 1
    statuses = sorted({status for count in counts for status in count}, key=str)
    highest = max(sum(count.values()) for count in counts)
    ticks = [(v, _number(v)) for v in _nice_ticks(0, highest) if v == int(v)]
    chart = Chart("requests", (bins.start, bins.start + bins.count * bins.width), (0, max(highest, ticks[-1][0])),
                   bins.ticks(), ticks, f"time (UTC), bins of {duration(bins.width)}", "requests")  # fmt: skip
    for i, count in enumerate(counts):
        low, at = 0, bins.start + i * bins.width
        for status in statuses:
            if count[status]:
                chart.bar(at, at + bins.width, low, low + count[status], _status_colour(status, statuses),
                          f"{_clock(at, bins.width)}: {count[status]} × HTTP {status}")  # fmt: skip
                low += count[status]
    total = Counter(entry.get("http_status") for _, entry in timed)
    legend = " ".join(f'<span class="key"><i style="background:{_status_colour(s, statuses)}"></i>HTTP {escaped(s)}: '
                      f'{total[s]}</span>' for s in statuses)  # fmt: skip
    return chart.svg(), legend


def shift_plot(shifts: list[tuple[float, dict[str, Any]]], x_range: tuple[float, float], ticks: list,
                alpha: float) -> str:  # fmt: skip
    """The SVG of every p-value over time (log scale), α as a line, alarms in red."""
    lowest = min([alpha, *(e["shift"]["p_value"] for _, e in shifts if e["shift"]["p_value"] > 0)])
    floor = 10 ** math.floor(math.log10(lowest))
    y_ticks = [(10.0**k, _number(10.0**k)) for k in range(round(math.log10(floor)), 1)]
    chart = Chart("shift", x_range, (floor, 1.0), ticks, y_ticks, "time (UTC)", "p-value (log scale)", log_y=True)
    chart.level(alpha, "#c62828", f"α = {alpha:g}")
    for seconds, entry in shifts:
        shift = entry["shift"]
        alarm = shift.get("verdict") == "shift"
        tip = (f"{datetime.fromtimestamp(seconds, timezone.utc):%Y-%m-%d %H:%M:%S} caller {entry.get('caller')}: p = "
               f"{shift['p_value']:.4g}, {shift.get('verdict')} (batch {shift.get('batch')}, window "
               f"{shift.get('window')})")  # fmt: skip
        chart.point(seconds, max(shift["p_value"], floor), "#c62828" if alarm else "#1565c0", tip,
                    "alarm" if alarm else "point")  # fmt: skip
    return chart.svg()


def set_plots(items: list[tuple[float, int, int]], bins: Bins, classes: int) -> tuple[str, str]:
    """(the SVG of the mean set size per bin, the SVG of the shares of empty and all-classes sets per bin) from
    ``(time, set size, classes)`` of every scored item with a set."""
    per_bin: list[list[tuple[int, int]]] = [[] for _ in range(bins.count)]
    for seconds, size, n in items:
        per_bin[bins.index(seconds)].append((size, n))
    x_range, ticks = (bins.start, bins.start + bins.count * bins.width), bins.ticks()
    x_label = f"time (UTC), bins of {duration(bins.width)}"
    sizes = Chart("set-size", x_range, (0, classes), ticks, [(v, _number(v)) for v in range(classes + 1)], x_label,
                   "mean set size (classes)")  # fmt: skip
    shares = Chart("set-shares", x_range, (0, 1), ticks, [(v / 4, f"{v * 25}%") for v in range(5)], x_label,
                    "share of the bin's sets")  # fmt: skip
    mean, empty, full = [], [], []
    for i, chosen in enumerate(per_bin):
        if not chosen:
            continue
        middle = bins.start + (i + 0.5) * bins.width
        mean.append((middle, sum(s for s, _ in chosen) / len(chosen)))
        empty.append((middle, sum(s == 0 for s, _ in chosen) / len(chosen)))
        full.append((middle, sum(s == n for s, n in chosen) / len(chosen)))
        where = f"{_clock(bins.start + i * bins.width, bins.width)} ({len(chosen)} sets)"
        sizes.point(middle, mean[-1][1], "#1565c0", f"{where}: mean size {mean[-1][1]:.2f}", "mean")
        shares.point(middle, empty[-1][1], "#c62828", f"{where}: {empty[-1][1]:.0%} empty", "empty")
        shares.point(middle, full[-1][1], "#616161", f"{where}: {full[-1][1]:.0%} hold every class", "full")
    sizes.line(mean, "#1565c0", "mean")
    shares.line(empty, "#c62828", "empty")
    shares.line(full, "#616161", "full")
    return sizes.svg(), shares.svg()


def histogram(tops: list[float], bins: int = 20) -> str:
    """The SVG of a histogram of ``tops`` (values in [0, 1]) in ``bins`` equal-width bins."""
    counts = [0] * bins
    for value in tops:
        counts[min(max(int(value * bins), 0), bins - 1)] += 1
    ticks = [(v, _number(v)) for v in _nice_ticks(0, max(counts)) if v == int(v)]
    chart = Chart("top-probability", (0, 1), (0, max(max(counts), ticks[-1][0])),
                   [(v / 10, f"{v / 10:g}") for v in range(11)], ticks, "top calibrated probability", "items")
    for i, count in enumerate(counts):
        if count:
            chart.bar(i / bins, (i + 1) / bins, 0, count, "#5e35b1", f"[{i / bins:.2f}, {(i + 1) / bins:.2f}): {count}")
    return chart.svg()
