"""Which columns a change moved: each column's mean and standard deviation over the rows before a
change point and over those after it, as its detector held them when it reported the change.

A stream of several columns (a gaussian over latency, error rate and queue depth) reports one
change point for all of them; an operator's next question is which of them changed. The models
do not answer it in general (a mixture's clusters, a regression's coefficients are not columns),
so this is a description of the data, not a model: for each column, its mean and sample standard
deviation (ddof 1) before and after, ``shift`` = (mean after - mean before) / sd before (how far
the column moved, in its own spread before the change) and ``scale`` = sd after / sd before.

The rows are the detector's own (``Detector.update``): "before" is the regime's rows it keeps
before the change (those since its last change or its start that a challenger may still start
from: its ``max_age``, after its warm-up), "after" the rows from the change to its report. Both
are short where a change is found fast (a 5-sd shift point by point: a few rows after), so the
figures are rough there; ``rows_before`` and ``rows_after`` say how many. One-column streams have
none (the change is the column's)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

#: the keys of a change's column summary (``column_moves``), each a list over the columns but the counts
KEYS = ("mean_before", "mean_after", "sd_before", "sd_after")


def column_moves(before: torch.Tensor, after: torch.Tensor) -> dict | None:
    """The columns' means and standard deviations over ``before`` [n_b, C] and ``after`` [n_a, C]
    (float64), as JSON-ready lists; None with fewer than 2 columns or no row on either side. A
    standard deviation of one row is None."""
    if before.dim() != 2 or after.dim() != 2 or before.shape[1] < 2 or before.shape[0] == 0 or after.shape[0] == 0:
        return None

    def stats(x: torch.Tensor) -> tuple[list[float], list[float | None]]:
        # about the first row: raw units at an offset of 1e6 keep their digits, and a constant column
        # has its value as its mean and an sd of 0 exactly (0.1 ten times has a mean 1 ulp off, and an sd
        # of 1e-17 read "flag -1.00 sd (sd x0.00)": a review)
        x = x.to(torch.float64)
        d = x - x[0]
        m = d.mean(0)
        sd = (d - m).square().sum(0).div(x.shape[0] - 1).sqrt() if x.shape[0] > 1 else None
        return [float(v) for v in x[0] + m], [None] * x.shape[1] if sd is None else [float(v) for v in sd]

    mb, sb = stats(before)
    ma, sa = stats(after)
    return {"rows_before": int(before.shape[0]), "rows_after": int(after.shape[0]),
            "mean_before": mb, "mean_after": ma, "sd_before": sb, "sd_after": sa}


def named(moves: dict | None, names: Sequence[str] | None = None) -> list[dict] | None:
    """``column_moves`` as the API answers it: one entry per column, in the stream's order, with
    its name (``names``; its index where none are given), ``shift``, ``scale``, the four
    figures and the rows on each side. ``shift`` is None where the column was constant before and moved (no spread to
    measure it in: its means say how far), 0 where it did not; ``scale`` None without both
    spreads or with none before."""
    if not moves:
        return None
    out = []
    for j in range(len(moves["mean_before"])):
        mb, ma, sb, sa = (moves[k][j] for k in KEYS)
        if sb is None:
            shift = None
        elif sb > 0.0:
            shift = (ma - mb) / sb
        else:
            shift = 0.0 if ma == mb else None
        scale = sa / sb if sa is not None and sb is not None and sb > 0.0 else None
        out.append({"column": names[j] if names is not None and j < len(names) else j, "shift": shift, "scale": scale,
                    "mean_before": mb, "mean_after": ma, "sd_before": sb, "sd_after": sa,
                    "rows_before": moves["rows_before"], "rows_after": moves["rows_after"]})
    return out


def _size(entry: dict) -> float:
    """How far a column moved, for ranking: |shift|, or its spread's change in the same terms
    (|log scale| x 3: a spread x2 ranks with a 2-sd shift); a constant column that moved first."""
    if entry["shift"] is None and entry["mean_after"] != entry["mean_before"]:
        return math.inf
    shift = abs(entry["shift"] or 0.0)
    scale = entry["scale"]
    return max(shift, 3.0 * abs(math.log(scale)) if scale else 0.0)


def summary(moves: dict | None, names: Sequence[str] | None = None, most: int = 3) -> str | None:
    """The columns that moved most, in words (``cusp replay``, the workers' log, the live page's
    list): "b +4.90 sd (sd x1.02), a -0.31 sd (sd x0.97); 40 rows before, 8 after"."""
    entries = named(moves, names)
    if not entries:
        return None
    ranked = sorted(entries, key=_size, reverse=True)[:most]

    def one(e: dict) -> str:
        if e["shift"] is None:
            what = f"mean {e['mean_before']:.6g} -> {e['mean_after']:.6g}"
        else:
            what = f"{e['shift']:+.2f} sd"
        return f"{e['column']} {what}" + (f" (sd x{e['scale']:.2f})" if e["scale"] is not None else "")

    return f"{', '.join(one(e) for e in ranked)}; {moves['rows_before']} rows before, {moves['rows_after']} after"


def moved(moves: dict | None, names: Sequence[str] | None = None) -> str:
    """``summary`` as the end of a log line ("; moved most: ..."), "" with none."""
    said = summary(moves, names)
    return "" if said is None else f"; moved most: {said}"
