"""Shared CLI options and renderers (table | json | csv | markdown).

Reports are objects with ``to_dict()`` (JSON), ``rows()`` (flat per-row dicts for
csv/markdown/table) and optionally ``summary_items()`` (key/value lines shown
above the table).  ``--output`` files are written atomically.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import sys

import click

from .paths import WritePath

FORMATS = ("table", "json", "csv", "markdown")


def output_options(fn):
    """``--format``, ``--output`` and ``--force`` for any command that renders a report."""
    fn = click.option("--force", is_flag=True,
                      help="Replace an existing output, atomically (an input is never replaced).")(fn)
    fn = click.option("--output", "-o", "output", type=WritePath(dir_okay=False), default=None,
                      help="Write the report to FILE (atomically) instead of stdout; an existing FILE needs "
                           "--force.")(fn)
    fn = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                      help="Report format (json is the stable contract).")(fn)
    return fn


def epsilon_option(when: str = ""):
    """``--epsilon RAD``, one type, default and spelling in analyze and fold-bias (issue 36)."""
    return click.option("--epsilon", type=float, default=0.1, show_default=True, metavar="RAD",
                        help=f"{when}A rotary pair is near-redundant when it turns less than RAD radians over the "
                             "context (L positions).")


def progress_option(fn):
    """``--progress/--no-progress``, the same switch and default on every long-running command."""
    return click.option("--progress/--no-progress", default=None,
                        help="Progress bars on stderr. Default: only when stderr is a terminal "
                             "(CKPT_SURGEON_PROGRESS=1/0 changes that default).")(fn)


def check_report_path(path: str | None, force: bool, sources=()) -> None:
    """Refuse a report FILE before any work: one that exists (unless ``force``), one that is an
    input, or one whose folder does not exist.  The same rule and messages as surgery and
    conversion outputs (:func:`ckpt_surgeon.conversion.output_path.check_output`)."""
    if path is None:
        return
    from pathlib import Path

    from ..conversion.output_path import check_output
    local = [os.fspath(s) for s in sources if s is not None and os.path.exists(os.fspath(s))]
    check_output(Path(path), local, force)    # (a folder FILE is refused by click's dir_okay=False)


def write_atomic(path: str, text: str, *, force: bool = True) -> None:
    """Temp file beside ``path``, fsync, rename (:mod:`ckpt_surgeon.publish`): readers never see half
    a file.  ``force=False``: an existing ``path`` is never clobbered, even by a race (the publish
    is a hard link, which fails if ``path`` appeared meanwhile)."""
    from ..publish import write_file_atomic
    write_file_atomic(os.path.abspath(path), text.encode("utf-8"), replace=force)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"      # a value that is NaN (a NaN bias); an absent one is None: "-" (issue 24)
        if v == 0:
            return "0.0"      # a measured or computed zero (an int 0 shows as "0"; nothing at all as "-")
        return f"{v:.4g}" if (abs(v) >= 1e-3 and abs(v) < 1e5) else f"{v:.3e}"
    return str(v)


def to_json(report) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False, default=str) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    cols = _columns(rows)
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return buf.getvalue()


def _columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def to_markdown(rows: list[dict], summary=None) -> str:
    out = []
    if summary:
        out += [f"- **{k}**: {v}" for k, v in summary] + [""]
    cols = _columns(rows)
    if cols:
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "|".join("---" for _ in cols) + "|")
        for r in rows:
            out.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(out) + "\n"


def table_width(stream=None) -> int | None:
    """Columns a table may use: ``COLUMNS`` when set, else the terminal's width when ``stream``
    (stdout by default) is a terminal, else None: no limit, every cell at its full width, so that a
    table redirected to a file or a pipe keeps every file and tensor name whole (issue 24)."""
    cols = os.environ.get("COLUMNS", "").strip()
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    stream = sys.stdout if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):       # a closed or replaced stream
        tty = False
    return shutil.get_terminal_size().columns if tty else None


# A table with no width limit is laid out on a console this wide; rich sizes a table (expand=False)
# to its content, so this is only an upper bound no real report reaches.
_UNLIMITED = 1 << 16


def to_table(rows: list[dict], summary=None, notes=(), title: str | None = None, width: int | None = None) -> str:
    """The human table.  ``width``: columns to fit (None: as wide as the content).  A cell too
    long for its column is wrapped onto more lines (``fold``), never cut with an ellipsis, and no
    line ends in padding spaces."""
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    # markup=False: a report's text is data ("[not in registry]", tensor names with brackets), never rich markup
    con = Console(file=buf, width=width or _UNLIMITED, force_terminal=False, color_system=None, highlight=False,
                  markup=False,
                  soft_wrap=width is None)
    if summary:
        kv = Table(show_header=False, box=None, pad_edge=False, title=title)
        kv.add_column(style="bold", overflow="fold")
        kv.add_column(overflow="fold")
        for k, v in summary:
            kv.add_row(k, v)
        con.print(kv)
    cols = _columns(rows)
    if cols:
        t = Table(show_lines=False)
        for c in cols:
            t.add_column(c, justify="right" if c not in ("tensor", "role", "class", "note") else "left",
                         overflow="fold")
        for r in rows:
            t.add_row(*[_cell(r.get(c)) for c in cols])
        con.print(t)
    for n in notes:
        con.print(f"note: {n}")
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def emit(report, fmt: str, output: str | None, *, title: str | None = None, force: bool = False) -> None:
    rows = report.rows()
    summary = report.summary_items() if hasattr(report, "summary_items") else None
    if fmt == "json":
        text = to_json(report)
    elif fmt == "csv":
        text = to_csv(report.csv_rows() if hasattr(report, "csv_rows") else rows)
    elif fmt == "markdown":
        text = to_markdown(rows, summary)
    else:
        notes = list(getattr(report, "notes", ())) + [f"warning: {w}" for w in getattr(report, "warnings", ())]
        rows = report.table_rows() if hasattr(report, "table_rows") else rows
        text = to_table(rows, summary, notes, title=title, width=None if output else table_width())
    if output:
        write_atomic(output, text, force=force)
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def source_options(fn):
    """Options every command that opens a SOURCE shares (with ``--progress/--no-progress``)."""
    fn = progress_option(fn)
    fn = click.option("--allow-full-download", is_flag=True,
                      help="Hub sources: download whole files when the server ignores HTTP Range.")(fn)
    fn = click.option("--file", "hub_file", default=None, help="Hub sources: which file to use (one GGUF of a GGUF "
                                                               "repo; any part of a split GGUF selects them all).")(fn)
    fn = click.option("--revision", default=None, help="Hub sources: branch, tag or commit sha.")(fn)
    fn = click.option("--allow-pickle", is_flag=True,
                      help="Read pickle checkpoints (pytorch_model.bin) with torch.load(weights_only=True); off by "
                           "default: pickles can run code.")(fn)
    return fn


def open_kwargs(allow_pickle=False, revision=None, hub_file=None, allow_full_download=False, progress=None) -> dict:
    return {"allow_pickle": allow_pickle, "revision": revision, "file": hub_file,
            "allow_full_download": allow_full_download, "progress": progress}


def byte_progress(enabled: bool | None, total: int, desc: str):
    """A tqdm byte bar on stderr (``enabled`` None: by :func:`ckpt_surgeon.progress.progress_enabled`'s
    rule, on only when stderr is a terminal) -> ``(bar, tick)``, where ``tick(nbytes)`` is the
    progress callback the library takes; ``(None, None)`` when off."""
    from ..progress import bar, progress_enabled
    if total <= 0 or not progress_enabled(enabled):
        return None, None
    b = bar(True, total=total, desc=desc)
    return b, b.update
