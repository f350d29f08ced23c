"""Parsing and validating ingest bodies into a float64 matrix [rows, columns].

Accepted: JSON ``{"seq": 17, "rows": [[...], ...]}`` or ``{"seq": 17, "columns": {"x": [...]}}``;
NDJSON (one JSON array or column object per line) and CSV (optional header naming the
columns) with ``seq`` as a query parameter. Every failure is a ``ChunkError`` with a message
naming the row and column at fault; nothing is stored before validation passed.

Rows may carry their times (``service.times``: RFC 3339, a date, or epoch seconds): a ``time``
list beside ``rows``/``columns`` in JSON (or a ``time`` entry of ``columns``), a ``time`` key in
NDJSON objects, a ``time`` column in a CSV header, and for raw float64 bodies (``?times=first``)
each row's first value. A stream column named ``time`` is data, not a time. Parsers return
``(data, times)``, ``times`` None when the chunk gave none (the arrival time is used).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys

import numpy as np

from service import times as T


#: a ChunkError's error code (service.api.errors.CODES) when it names none: by its status
CHUNK_CODES = {400: "malformed_body", 404: "stream_not_found", 409: "seq_gap", 413: "chunk_too_large", 415: "unsupported_media_type",
               422: "invalid_rows", 429: "backlog_full"}
TIME = "time"  # the field, key or column that carries the rows' times


def _times(values: object, rows: int, what: str = TIME) -> np.ndarray:
    try:
        return T.parse_all(values, rows, what)
    except T.TimeError as exc:
        raise ChunkError(str(exc), 422, "invalid_time") from None


class ChunkError(ValueError):
    """A chunk refused: ``status`` (HTTP), ``code`` (service.api.errors.CODES) and ``reason``, the
    label ``cusp_ingest_rejected_total`` counts it under (once, where the route answers it)."""

    def __init__(self, message: str, status: int = 422, code: str | None = None, retry_after: float | None = None,
                 reason: str = "invalid"):
        super().__init__(message)
        self.status, self.code, self.retry_after, self.reason = status, code or CHUNK_CODES[status], retry_after, reason


class _Constant(float):
    """NaN, Infinity or -Infinity as the JSON text spelled it (Python's json reads them): kept as a
    value until it is read as one, then refused naming its row and column (``_number``)."""

    token: str

    def __new__(cls, token: str) -> "_Constant":
        out = super().__new__(cls, float(token))
        out.token = token
        return out


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ChunkError(f"JSON object has the key {key!r} twice", 400)
        out[key] = value
    return out


def loads(body: bytes | str, line: int | None = None) -> object:
    """JSON as RFC 8259 has it exchanged: UTF-8 without a byte-order mark (json.loads would also
    take UTF-16 and UTF-32, and skip a BOM), no key twice in an object, no NaN or Infinity.
    ``line``: the body's line this text is (NDJSON), which errors name (json's own "line 1 column C"
    would be the line within it)."""
    if isinstance(body, bytes):
        if body.startswith(b"\xef\xbb\xbf"):
            raise ChunkError("body starts with a byte-order mark; send UTF-8 without one", 400)
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ChunkError("body is not UTF-8 (JSON must be UTF-8)", 400) from None
    try:
        return json.loads(body, parse_constant=_Constant, object_pairs_hook=_no_duplicates)
    except ChunkError as exc:
        if line is None:
            raise
        raise ChunkError(f"line {line}: {exc}", exc.status, exc.code) from None
    except RecursionError:
        raise ChunkError("JSON nested too deeply" if line is None else f"line {line}: JSON nested too deeply", 400) from None
    except json.JSONDecodeError as exc:
        raise ChunkError(f"body is not valid JSON: {exc}" if line is None else
                         f"line {line} is not valid JSON: {exc.msg} at column {exc.colno}", 400) from None
    except (ValueError, UnicodeDecodeError) as exc:
        why = str(exc)
        if "integer string conversion" in why:  # (Python's own limit; its message told the sender to call sys.set_int_max_str_digits)
            why = f"an integer has more than {sys.get_int_max_str_digits():,} digits"
        raise ChunkError(f"body is not valid JSON: {why}" if line is None else f"line {line} is not valid JSON: {why}",
                         400) from None


def _number(v: object, where: str) -> float:
    if isinstance(v, _Constant):
        raise ChunkError(f"{where}: {v.token} is not accepted (only finite numbers)")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ChunkError(f"{where}: {json.dumps(v)[:40]} is not a number")
    try:
        f = float(v)
    except OverflowError:  # a JSON integer with hundreds of digits
        raise ChunkError(f"{where}: {str(v)[:20]}... is too large") from None
    if not math.isfinite(f):
        raise ChunkError(f"{where}: {v!r} is not finite")
    return f


_PLAIN = frozenset((int, float))


def _fast_matrix(lists: list, width: int) -> np.ndarray | None:
    """``lists`` (each a list of ``width`` plain JSON numbers) as one float64 array ``[len, width]``
    in one numpy call, or None when any value needs the per-value checks below (they name the
    row and column at fault). Same numbers as ``float(v)``; about 5x faster than the loop."""
    if not all(type(x) is list and len(x) == width for x in lists) or not {type(v) for x in lists for v in x} <= _PLAIN:
        return None
    try:
        out = np.array(lists, dtype=np.float64).reshape(len(lists), width)
    except (OverflowError, ValueError):
        return None
    return out if bool(np.isfinite(out).all()) else None


def matrix_from_rows(rows: object, columns: list[str]) -> np.ndarray:
    if not isinstance(rows, list):
        raise ChunkError("'rows' must be a list of rows (lists of numbers)")
    c = len(columns)
    fast = _fast_matrix(rows, c)
    if fast is not None:
        return fast
    out = np.empty((len(rows), c), dtype=np.float64)
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise ChunkError(f"row {i}: must be a list of {c} numbers")
        if len(row) != c:
            raise ChunkError(f"row {i}: has {len(row)} values, the stream has {c} columns {columns}")
        for j, v in enumerate(row):
            out[i, j] = _number(v, f"row {i} column {columns[j]!r}")
    return out


def matrix_from_columns(cols: object, columns: list[str]) -> np.ndarray:
    if not isinstance(cols, dict):
        raise ChunkError("'columns' must be an object mapping column name -> list of numbers")
    missing, extra = [c for c in columns if c not in cols], [c for c in cols if c not in columns]
    if missing or extra:
        raise ChunkError(f"columns must be exactly {columns}; missing {missing}, unknown {extra}")
    lengths = {c: len(cols[c]) if isinstance(cols[c], list) else -1 for c in columns}
    if any(v < 0 for v in lengths.values()):
        bad = next(c for c, v in lengths.items() if v < 0)
        raise ChunkError(f"column {bad!r}: must be a list of numbers")
    if len(set(lengths.values())) != 1:
        raise ChunkError(f"columns have different lengths: {lengths}")
    n = lengths[columns[0]]
    fast = _fast_matrix([cols[c] for c in columns], n)
    if fast is not None:
        return np.ascontiguousarray(fast.T)
    out = np.empty((n, len(columns)), dtype=np.float64)
    for j, c in enumerate(columns):
        for i, v in enumerate(cols[c]):
            out[i, j] = _number(v, f"row {i} column {c!r}")
    return out


def parse_json_chunk(body: bytes, columns: list[str]) -> tuple[int, np.ndarray, np.ndarray | None]:
    doc = loads(body)
    if not isinstance(doc, dict):
        raise ChunkError("body must be a JSON object like {\"seq\": 0, \"rows\": [[...]]}", 400)
    unknown = set(doc) - {"seq", "rows", "columns", TIME}
    if unknown:
        raise ChunkError(f"unknown field(s) {sorted(unknown)}; expected seq, rows or columns, and optionally time")
    seq = parse_seq(doc.get("seq"))
    if ("rows" in doc) == ("columns" in doc):
        raise ChunkError("give exactly one of 'rows' or 'columns'")
    given = doc.get(TIME)
    if "rows" in doc:
        data = matrix_from_rows(doc["rows"], columns)
    else:
        cols = doc["columns"]
        if isinstance(cols, dict) and TIME in cols and TIME not in columns:
            if TIME in doc:
                raise ChunkError("the times are given twice: as the field 'time' and as columns['time']", 422, "invalid_time")
            cols = dict(cols)
            given = cols.pop(TIME)
        data = matrix_from_columns(cols, columns)
    return seq, data, None if given is None else _times(given, data.shape[0])  # "time": null is no times


def parse_body(content_type: str, body: bytes, seq: int | None, columns: list[str],
               times_first: bool = False) -> tuple[int, np.ndarray, np.ndarray | None]:
    """An HTTP body of ``content_type`` as (seq, data, times or None); NDJSON, CSV and raw float64
    take ``seq`` from the query (JSON carries its own). ``times_first``: a float64 body's rows
    start with their time in epoch seconds (``?times=first``)."""
    if times_first and content_type != "application/octet-stream":
        raise ChunkError("?times=first is for application/octet-stream bodies; the other formats carry a 'time' "
                         "field, key or column", 422, "invalid_time")
    if content_type in ("application/x-ndjson", "application/ndjson", "text/csv", "application/octet-stream"):
        if seq is None:
            raise ChunkError("NDJSON, CSV and float64 bodies need ?seq=N", 422, "invalid_seq")
        if content_type == "application/octet-stream":
            return (seq, *parse_float64(body, columns, times_first))
        return (seq, *(parse_csv if content_type == "text/csv" else parse_ndjson)(body, columns))
    if content_type in ("application/json", ""):
        got = parse_json_chunk(body, columns)
        if seq is not None and seq != got[0]:  # two seqs that disagree: which was meant is unknown
            raise ChunkError(f"?seq={seq} and the body's seq {got[0]} differ; a JSON body carries its own seq (leave "
                             "?seq out)", 422, "invalid_seq")
        return got
    raise ChunkError(f"unsupported content type {content_type!r}; use application/json, application/x-ndjson, text/csv "
                     "or application/octet-stream (raw little-endian float64 rows)", 415)


def parse_seq(value: object) -> int:
    """A JSON integer in [0, 2**53]; strings, floats (even 1.0), booleans and null are refused."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**53:
        shown = json.dumps(value)[:40] if not isinstance(value, int) else str(value)[:40]
        raise ChunkError(f"seq must be a non-negative integer (at most 2**53), got {shown}", 422, "invalid_seq")
    return value


def parse_ndjson(body: bytes, columns: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
    rows: list[list[float]] = []
    stamps: list[object] = []
    keys = set(columns)
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise ChunkError("NDJSON body is not UTF-8", 400) from None
    # lines end at \n only (str.splitlines would also split inside a value at U+2028 and the like)
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        item = loads(line, lineno)
        if isinstance(item, dict):
            timed = TIME in item and TIME not in keys
            if timed != bool(stamps) and rows:
                raise ChunkError(f"line {lineno}: {'has' if timed else 'has no'} 'time' key, unlike the lines before it; "
                                 "give a time on every line or on none", 422, "invalid_time")
            if set(item) - ({TIME} if timed else set()) != keys:
                raise ChunkError(f"line {lineno}: keys must be exactly {columns}, optionally with 'time'")
            if timed:
                stamps.append(item[TIME])
            item = [item[c] for c in columns]
        elif stamps:
            raise ChunkError(f"line {lineno}: an array line has no time, unlike the lines before it; give a time on every "
                             "line or on none", 422, "invalid_time")
        rows.append(item)  # type: ignore[arg-type]
    data = matrix_from_rows(rows, columns)
    return data, _times(stamps, data.shape[0]) if stamps else None


def parse_csv(body: bytes, columns: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise ChunkError("CSV body is not UTF-8", 400) from None
    try:
        rdr = csv.reader(io.StringIO(text))
        read = [(rdr.line_num, r) for r in rdr]
    except csv.Error as exc:  # a NUL byte, a field over the csv module's size limit
        raise ChunkError(f"CSV body cannot be read: {exc}", 400) from None
    # blank lines are no rows; each row's line in the body (1-based, the header's counted) goes
    # with its index in errors (a new user's "row 2" was the body's fourth line)
    read = [(ln, r) for ln, r in read if r and any(c.strip() for c in r)]
    lines, reader = [ln for ln, _ in read], [r for _, r in read]
    stamps: list[object] | None = None
    header = [c.strip() for c in reader[0]] if reader else []
    if TIME in header and TIME not in columns and sorted(c for c in header if c != TIME) == sorted(columns) \
            and len(header) == len(columns) + 1:
        at = header.index(TIME)
        order = [header.index(c) for c in columns]
        for i, r in enumerate(reader[1:]):
            if len(r) != len(header):
                raise ChunkError(f"row {i} (line {lines[i + 1]}): has {len(r)} values, the header has {len(header)} (time "
                                 f"and columns {columns})")
        stamps = [_csv_time(r[at].strip()) for r in reader[1:]]
        reader, lines = [[r[k] for k in order] for r in reader[1:]], lines[1:]
    elif header != columns and any(T.looks_like(c) for c in header) and all(_is_number(c) or T.looks_like(c) for c in header):
        # (a header-less chunk of dates and values: "2021-01-01,5" was called a header with an extra column)
        raise ChunkError(f"row 0 (line {lines[0]}) {header} is a time and values, with no header: the rows' times go in a "
                         f"column named {TIME!r}, which a header names; make the first line {','.join([TIME, *columns])}",
                         422, "invalid_time")
    elif header == columns and all(_is_number(c) and "_" not in c and math.isfinite(float(c)) for c in header):
        # (columns named 0 and 1, pandas' default: the row "0,1" was taken for the header and dropped
        # without a word, a new user's trial; as data it would be a row the sender may not have meant)
        raise ChunkError(f"the first row {header} is both the stream's column names and a row of numbers: it cannot be told "
                         "whether it is the header or data. Send the chunk as JSON, or without that row if it is the header")
    elif header == columns:
        reader, lines = reader[1:], lines[1:]
    elif header and len(header) == len(columns) + 1 and not all(_is_number(c) for c in header):
        extra = [c for c in header if c not in columns]
        raise ChunkError(f"the header {header} has column(s) {extra} beside the stream's {columns}; the rows' times go in a "
                         f"column named {TIME!r}", 422, "invalid_time" if len(extra) == 1 else "invalid_rows")
    elif header and not any(_is_number(c) for c in header):  # a header (optional), but not the stream's columns
        raise ChunkError(f"the header {header} is not the stream's columns {columns} (a header is optional; when given, it "
                         f"is those columns in that order, or those and {TIME!r} for the rows' times in any order)")
    out = np.empty((len(reader), len(columns)), dtype=np.float64)
    for i, row in enumerate(reader):
        if len(row) != len(columns):
            raise ChunkError(f"row {i} (line {lines[i]}): has {len(row)} values, the stream has {len(columns)} columns {columns}")
        for j, cell in enumerate(row):
            try:
                if "_" in cell:  # float() reads '1_000' as 1000: a digit separator CSV does not have
                    raise ValueError
                v = float(cell)
            except ValueError:
                raise ChunkError(f"row {i} (line {lines[i]}) column {columns[j]!r}: {cell.strip()[:40]!r} is not a number") from None
            if not math.isfinite(v):
                raise ChunkError(f"row {i} (line {lines[i]}) column {columns[j]!r}: {cell.strip()!r} is not finite")
            out[i, j] = v
    return out, None if stamps is None else _times(stamps, out.shape[0])


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _csv_time(cell: str) -> object:
    """A CSV time cell: epoch seconds when it reads as a number, else the text (RFC 3339, a date)."""
    try:
        return float(cell) if "_" not in cell else cell
    except ValueError:
        return cell


def parse_float64(body: bytes, columns: list[str], times_first: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """``application/octet-stream``: the rows as raw little-endian float64, row after row (what
    ``numpy.ndarray.astype('<f8').tobytes()`` gives for a [rows, columns] array). The cheapest
    way in: no text to parse. Same checks as the other formats, naming the row and column.
    ``times_first``: each row starts with its time, epoch seconds (``?times=first``)."""
    extra = 1 if times_first else 0
    width = 8 * (len(columns) + extra)
    if len(body) % width:
        what = f"a time and {len(columns)} values" if extra else f"{len(columns)} float64 values"
        raise ChunkError(f"body has {len(body)} bytes, not a whole number of rows of {what} "
                         f"({width} bytes each) for columns {columns}")
    both = np.frombuffer(body, dtype="<f8").reshape(-1, len(columns) + extra).astype(np.float64)
    stamps = None
    if extra:
        stamps = both[:, 0].copy()
        try:
            T.check_increasing(stamps, "time")
        except T.TimeError as exc:
            raise ChunkError(str(exc), 422, "invalid_time") from None
    out = np.ascontiguousarray(both[:, extra:])
    bad = ~np.isfinite(out)
    if bad.any():
        i, j = (int(k[0]) for k in np.nonzero(bad))
        raise ChunkError(f"row {i} column {columns[j]!r}: {float(out[i, j])!r} is not finite")
    return out, stamps
