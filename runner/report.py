"""The experiments' shared table writer (CSV + Markdown), CSV reader and plot helper."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

# ------------------------------------------------------------------------------------------------
# The shared table writer and plot helper


@dataclasses.dataclass(frozen=True)
class Column:
    """One table column: Markdown `header`, row `key` (also the CSV header) and a format, either a
    `str.format` pattern or a callable; None and NaN print as "–"."""

    header: str
    key: str
    fmt: str | Callable[[Any], str] = "{}"


@dataclasses.dataclass
class Table:
    """A result table: `title` (a paragraph above it), `columns`, `rows` (dicts) and `notes`
    (paragraphs below it: the paper's claims, the verdict)."""

    title: str
    columns: Sequence[Column]
    rows: list[dict]
    notes: Sequence[str] = ()


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def read_csv(path: pathlib.Path) -> list[dict]:
    """The rows of a CSV file (a run's metrics.csv, an experiment's results.csv) as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def as_float(value) -> float:
    """`float(value)`, NaN for a blank or missing one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def format_cell(value, fmt: str | Callable[[Any], str] = "{}") -> str:
    if missing(value):
        return "–"
    text = fmt(value) if callable(fmt) else fmt.format(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[Column], rows: Sequence[dict]) -> str:
    lines = ["| " + " | ".join(c.header for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row.get(c.key), c.fmt) for c in columns)
                     + " |")
    return "\n".join(lines)


def write_table(output_dir: os.PathLike | str, table: Table, stem: str = "results") -> str:
    """Writes `<stem>.csv` (one column per `Column.key`, raw values) and `<stem>.md` (title,
    Markdown table, notes); returns the Markdown text."""
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / f"{stem}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([c.key for c in table.columns])
        for row in table.rows:
            writer.writerow(["" if row.get(c.key) is None else row.get(c.key)
                             for c in table.columns])
    parts = [table.title.strip()] if table.title.strip() else []
    parts.append(markdown_table(table.columns, table.rows))
    parts += [n.strip() for n in table.notes if n.strip()]
    text = "\n\n".join(parts)
    (output_dir / f"{stem}.md").write_text(text + "\n")
    return text


@dataclasses.dataclass
class Series:
    """One line (or one bar group member) of a panel; `style` is a matplotlib format string;
    `band`, `(low, high)` aligned with `x`, is shaded around a line (e.g. the seeds' spread,
    `seed_series`)."""

    label: str
    x: Sequence
    y: Sequence[float]
    style: str = "-o"
    band: tuple[Sequence[float], Sequence[float]] | None = None


def seed_series(label: str, runs: Sequence[tuple[Sequence, Sequence[float]]]) -> Series:
    """One line for a setting run with several seeds (`runs`: each seed's `(x, y)`): the mean
    over the seeds at every x all of them have, shaded from the lowest to the highest seed.

    >>> s = seed_series("fedrep", [([1, 2], [0.5, 0.7]), ([1, 2, 3], [0.7, 0.9, 1.0])])
    >>> s.label, list(s.x), [round(v, 6) for v in s.y], s.band
    ('fedrep (2 seeds: mean, min–max)', [1, 2], [0.6, 0.8], ([0.5, 0.7], [0.7, 0.9]))
    """
    at = [dict(zip(x, y)) for x, y in runs]
    xs = [x for x in runs[0][0] if all(x in a for a in at)]
    values = [[a[x] for a in at] for x in xs]
    return Series(f"{label} ({len(runs)} seeds: mean, min–max)" if len(runs) > 1 else label, xs,
                  [sum(v) / len(v) for v in values],
                  band=([min(v) for v in values], [max(v) for v in values]))


@dataclasses.dataclass
class Panel:
    """One axes. `kind="line"` plots each series' (x, y); `kind="bar"` draws grouped bars, one
    group per entry of `categories` and one bar per series (series.y aligned with categories).
    `hlines` are dashed reference lines (label, y)."""

    title: str
    xlabel: str
    ylabel: str
    series: Sequence[Series]
    kind: str = "line"
    logy: bool = False
    logx: bool = False
    categories: Sequence[str] = ()
    hlines: Sequence[tuple[str, float]] = ()


def save_plot(path: os.PathLike | str, panels: Sequence[Panel], title: str = "") -> None:
    """Draws `panels` side by side into a PNG (matplotlib, Agg backend)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel.kind == "bar":
            n = max(1, len(panel.series))
            width = 0.8 / n
            positions = np.arange(len(panel.categories))
            for j, s in enumerate(panel.series):
                values = [np.nan if missing(v) else float(v) for v in s.y]
                ax.bar(positions + (j - (n - 1) / 2) * width, values, width, label=s.label)
            ax.set_xticks(positions, list(panel.categories))
        else:
            for s in panel.series:
                x = list(s.x)
                y = [np.nan if missing(v) else float(v) for v in s.y]
                line, = ax.plot(x, y, s.style, label=s.label, markersize=3)
                if s.band is not None:
                    ax.fill_between(x, *s.band, color=line.get_color(), alpha=0.2, linewidth=0)
        for label, value in panel.hlines:
            if not missing(value):
                ax.axhline(float(value), linestyle="--", linewidth=1, color="gray")
                ax.annotate(label, (0.01, float(value)), xycoords=("axes fraction", "data"),
                            fontsize=7, color="gray", va="bottom")
        if panel.logy:
            ax.set_yscale("log")
        if panel.logx:
            ax.set_xscale("log")
            ticks = sorted({v for s in panel.series for v in s.x})
            if ticks:
                ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
                ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if panel.series:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
