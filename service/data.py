"""Reading tabular data (CSV with a header, or .npy) into float64 tensors with clear errors; a
CSV's time column (``read_series``) into epoch seconds."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import torch

from service import times as T

#: column names ``read_series`` takes for the rows' times when none is named (case-insensitive)
TIME_COLUMNS = ("time", "timestamp", "ts", "date", "datetime")

#: the most columns a stream (and ``POST /v1/detect``, ``cusp.Detector``) takes
MAX_COLUMNS = 256

#: the largest magnitude of a value accepted anywhere (a stream's chunks, ``POST /v1/detect``, a
#: replayed file): the models square values (sums of squares, Student-t residuals), and beyond
#: about 1e154 a square overflows float64. A chunk of 1e308 was once accepted (202), failed in
#: the worker three times over 45 s and was dead-lettered by every model (a new user's trial);
#: 1e150 leaves room for a model's frame scaling a value up
MAX_MAGNITUDE = 1e150


def too_large(data: np.ndarray) -> tuple[int, int] | None:
    """(row, column) of the first value of ``data [rows, columns]`` beyond ``MAX_MAGNITUDE``, or None."""
    big = np.abs(np.asarray(data, dtype=np.float64)) > MAX_MAGNITUDE
    if not big.any():
        return None
    r, c = np.argwhere(big.reshape(big.shape[0], -1))[0]
    return int(r), int(c)


class DataError(ValueError):
    """Input data that cannot be used; the message says where and why."""


def read_table(path: str | Path) -> tuple[list[str], torch.Tensor]:
    """Returns (column names, data [N, C] float64). CSV needs a header row; .npy gets names c0..cN."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file")
    if p.is_dir():
        raise DataError(f"{p}: is a directory, expected a CSV or .npy file")
    if p.suffix == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except Exception as exc:  # numpy raises several types for bad files
            raise DataError(f"{p}: not a readable .npy file ({exc})") from None
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
            raise DataError(f"{p}: expected a 2-D numeric array, got shape {arr.shape} of {arr.dtype}")
        names = [f"c{i}" for i in range(arr.shape[1])]
        data = arr.astype(np.float64)
    else:
        names, data = _read_csv_fast(p)
        if data is None:  # anything unusual (quotes, blank lines, a bad value): the careful reader says what
            names, rows, _ = _read_csv(p)
            data = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
    return _checked(p, names, data)


def read_series(path: str | Path, time_column: str | None = None) -> tuple[list[str], torch.Tensor, np.ndarray | None]:
    """``read_table`` and the rows' times (epoch seconds, strictly increasing) from a CSV's time
    column: ``time_column``, or else the first column named as in ``TIME_COLUMNS``; its cells are
    RFC 3339 times, dates or epoch seconds (``service.times``). Times None when there is none."""
    p = Path(path)
    if p.suffix == ".npy" or not p.is_file():
        if time_column is not None and p.suffix == ".npy":
            raise DataError(f"{p}: a .npy file has no named columns; --time-column {time_column!r} needs a CSV")
        names, data = read_table(p)
        return names, data, None
    try:
        with p.open(newline="") as fh:
            header = [h.strip() for h in next(csv.reader([fh.readline()]), [])]
    except UnicodeDecodeError:
        raise DataError(f"{p}: not a text CSV file") from None
    if time_column is not None and time_column not in header:
        # as the automatic choice does (``TIME_COLUMNS``): a name that differs only in case is that
        # column when exactly one does (a new user's --time-column Date on a 'date' header)
        same = [h for h in header if h.lower() == time_column.lower()]
        if len(same) != 1:
            raise DataError(f"{p}: no column {time_column!r} for the times; the header has {header}")
        time_column = same[0]
    col = time_column or next((h for h in header if h.lower() in TIME_COLUMNS), None)
    if col is None:
        names, data = read_table(p)
        return names, data, None
    names, rows, cells = _read_csv(p, time_at=header.index(col))
    data = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
    names, tensor = _checked(p, names, data)
    try:
        stamps = np.array([T.parse(float(c) if _is_float(c) else c, f"{p}: line {line} column {col!r}") for line, c in cells])
    except T.TimeError as exc:
        raise DataError(str(exc)) from None
    try:
        T.check_increasing(stamps, col)
    except T.TimeError as exc:
        raise DataError(f"{p}: {exc} (rows counted from the first after the header)") from None
    return names, tensor, stamps


def _checked(p: Path, names: list[str], data: np.ndarray) -> tuple[list[str], torch.Tensor]:
    if data.shape[0] == 0:
        raise DataError(f"{p}: no data rows")
    bad = ~np.isfinite(data)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise DataError(f"{p}: row {r + 1} column {names[c]!r} is {data[r, c]} (NaN and infinite values are not accepted)")
    at = too_large(data)
    if at is not None:
        r, c = at
        raise DataError(f"{p}: row {r + 1} column {names[c]!r} is {float(data[r, c]):g}: values must be within +-{MAX_MAGNITUDE:g}")
    return names, torch.from_numpy(np.ascontiguousarray(data))


def _read_csv_fast(p: Path) -> tuple[list[str], np.ndarray | None]:
    """numpy's C reader for a plain numeric CSV (about 6x the csv module at 200,000 rows); data
    None when it cannot read the file as one, so that ``_read_csv`` names the problem."""
    import warnings

    try:
        with p.open(newline="") as fh:
            header = next(csv.reader([fh.readline()]), None)
            if not header or any(not h.strip() for h in header) or all(_is_float(h) for h in header):
                return [], None
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # an empty body warns: the careful reader reports it
                data = np.loadtxt(fh, delimiter=",", dtype=np.float64, ndmin=2, quotechar=None, comments=None)
    except (ValueError, UnicodeDecodeError, UserWarning, StopIteration):
        return [], None
    names = [h.strip() for h in header]
    if data.shape[0] == 0 or data.shape[1] != len(names) or len(set(names)) != len(names):
        return [], None
    return names, data


def _read_csv(p: Path, time_at: int | None = None) -> tuple[list[str], list[list[float]], list[tuple[int, str]]]:
    """(names, rows, time cells): the column ``time_at`` (if given) is left out of names and rows,
    its cells returned as (line number, text)."""
    cells: list[tuple[int, str]] = []
    try:
        with p.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise DataError(f"{p}: empty file")
            names = [h.strip() for h in header]
            if any(not n for n in names) or len(set(names)) != len(names):
                raise DataError(f"{p}: the header must name every column once, got {header}")
            dates = [T.looks_like(n) for n in names]
            if all(_is_float(n) for n in names) or (any(dates) and not all(dates) and
                                                    all(d or _is_float(n) for d, n in zip(dates, names))):
                # (a header-less file of a date and values too; columns named by dates alone are a header)
                raise DataError(f"{p}: the first line looks like data; a header row with column names is required")
            rows: list[list[float]] = []
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(names):
                    raise DataError(f"{p}: line {lineno} has {len(row)} fields, the header has {len(names)}")
                if time_at is not None:
                    cells.append((lineno, row[time_at].strip()))
                    row = row[:time_at] + row[time_at + 1:]
                try:
                    vals = [float(c) for c in row]
                except ValueError:
                    bad = next(c for c in row if not _is_float(c))
                    raise DataError(f"{p}: line {lineno}: {bad!r} is not a number") from None
                rows.append(vals)
    except UnicodeDecodeError:
        raise DataError(f"{p}: not a text CSV file") from None
    if time_at is not None:
        names = names[:time_at] + names[time_at + 1:]
        if not names:
            raise DataError(f"{p}: the only column is the times; no values to read")
    return names, rows, cells


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def resolve_target(names: list[str], target: str | None) -> int | None:
    """A target column given by name or index -> index (None: the model's default, the last column)."""
    if target is None:
        return None
    if target in names:
        return names.index(target)
    try:
        i = int(target)
    except ValueError:
        raise DataError(f"target column {target!r} is not one of {names}") from None
    if not -len(names) <= i < len(names):
        raise DataError(f"target column index {i} out of range for {len(names)} columns")
    return i % len(names)


def log_model_probabilities(log_evidences: dict[str, float], log_prior: dict[str, float] | None = None) -> dict[str, float]:
    """Posterior model probabilities from log-evidences (equal prior unless given)."""
    keys = list(log_evidences)
    if not keys:
        return {}
    lp = {k: log_evidences[k] + (log_prior or {}).get(k, -math.log(len(keys))) for k in keys}
    top = max(lp.values())
    z = sum(math.exp(v - top) for v in lp.values())
    return {k: math.exp(v - top) / z for k, v in lp.items()}
