"""Markdown and number formatting for the benchmark report, and the machine description."""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A GitHub markdown table. ``align``: one of 'l', 'r', 'c' per column (default: first
    column left, the rest right). Cells are str()-ed; '|' in a cell is escaped."""
    ncol = len(headers)
    if align is None:
        align = "l" + "r" * (ncol - 1)
    if len(align) != ncol:
        raise ValueError("align needs one letter per column")
    for r in rows:
        if len(r) != ncol:
            raise ValueError(f"row {list(r)!r} has {len(r)} cells, expected {ncol}")

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def fmt_num(x: float | None, digits: int = 3) -> str:
    """Compact number: '—' for None/NaN, scientific for very small/large magnitudes."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0:
        return "0"
    a = abs(x)
    if a < 1e-2 or a >= 1e7:
        return f"{x:.{max(digits - 1, 1)}e}"
    if a >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fmt_seconds(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "—"
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.2f} ms"
    if s < 100:
        return f"{s:.1f} s"
    return f"{s:,.0f} s"


def fmt_n(n: int) -> str:
    """1000 -> '1e3', 20000 -> '2e4', 12345 -> '12,345'."""
    e = int(math.floor(math.log10(n))) if n > 0 else 0
    m = n / 10**e if n > 0 else 0
    return f"{m:g}e{e}" if n > 0 and float(m).is_integer() else f"{n:,}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**missed**")


def machine() -> dict[str, str]:
    """CPU model and cores (lscpu), Python, torch, numpy, dynesty versions, the mixture kernel in use, date."""
    info: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Hypervisor vendor"):
                info[key.strip()] = val.strip()
    except (OSError, subprocess.SubprocessError):
        info["Model name"] = platform.processor() or "unknown"
        info["CPU(s)"] = str(os.cpu_count())
    import numpy
    import torch

    info["python"] = platform.python_version()
    info["torch"] = torch.__version__
    info["numpy"] = numpy.__version__
    from models import native

    info["mixture kernel"] = native.status()
    try:
        import dynesty

        info["dynesty"] = dynesty.__version__
    except ImportError:
        info["dynesty"] = "not installed"
    info["date"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return info


def markers(name: str) -> tuple[str, str]:
    return f"<!-- cusp bench {name}: begin -->", f"<!-- cusp bench {name}: end -->"


def write_section(path: str | Path, name: str, section: str) -> None:
    """Put ``section`` into the markdown file ``path`` between the markers of benchmark ``name``:
    in place of what a previous run wrote there, or appended. Every other part of the file (the
    other benchmarks' sections, hand-written text) is left exactly as it was."""
    begin, end = markers(name)
    body = f"{begin}\n{section.strip(chr(10))}\n{end}"
    p = Path(path)
    old = p.read_text() if p.exists() else "# Benchmarks\n"
    if begin in old and end in old.split(begin, 1)[1]:
        head, rest = old.split(begin, 1)
        new = head + body + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + body + "\n"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(new)
