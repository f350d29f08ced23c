"""Timestamps: what the API accepts as a row's time, and how it answers with one.

A time is given as an RFC 3339 string with a UTC offset (``2026-11-26T08:00:00Z``,
``2026-11-26T09:00:00.250+01:00``), a date ``YYYY-MM-DD`` (midnight UTC: yearly and daily
series), or epoch seconds (a number; negative before 1970). Inside cusp a time is float64 epoch
seconds (microseconds exact for 285 years either side of 1970); answers give RFC 3339 UTC strings
with microseconds (``2026-11-26T08:00:00.000000Z``), which every client library parses.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone

import numpy as np

#: the epoch seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: what a datetime can hold
EARLIEST, LATEST = -62135596800.0, 253402300799.0
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
#: RFC 3339's date-time (section 5.6): T or a space, seconds, an optional fraction, Z or +hh:mm;
#: any case. Not ISO 8601's other forms (week dates, basic format, +hhmm) that fromisoformat takes.
_RFC3339 = re.compile(r"^([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class TimeError(ValueError):
    """A time that cannot be read, or times out of order; the message names which and why."""


def looks_like(text: str) -> bool:
    """Whether ``text`` has the shape of an RFC 3339 time (with or without its offset) or a date: a
    cell of data, not a column's name (a header-less CSV whose first row is a date and values)."""
    text = text.strip()
    return bool(_RFC3339.match(text) or _DATE.match(text))


def parse(value: object, where: str) -> float:
    """One time (RFC 3339 string with an offset, a date, or epoch seconds) as epoch seconds."""
    if isinstance(value, str):
        text = value.strip()
        bad = TimeError(f"{where}: {value[:40]!r} is not an RFC 3339 time like '2026-05-01T12:00:00Z' "
                        "(or a date like '2026-05-01', or epoch seconds)")
        m = _RFC3339.match(text)
        if m is None and not _DATE.match(text):
            raise bad
        if m is not None and m.group(4) is None:
            raise TimeError(f"{where}: {value[:40]!r} has no UTC offset; RFC 3339 needs one, e.g. 'Z' or '+02:00'")
        try:
            if m is None:  # a date: midnight UTC
                return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()
            day, clock, fraction, zone = m.groups()
            # a leap second (RFC 3339 allows :60 in a minute's last second; datetime does not): epoch
            # seconds, like POSIX time, do not count it, so 23:59:60 is read as the second after 23:59:59
            leap = clock.endswith(":59:60")
            if leap:
                clock = clock[:-2] + "59"
            # microseconds: the fraction is rounded to them (the service keeps float64 epoch seconds)
            d = datetime.fromisoformat(f"{day}T{clock}{'+00:00' if zone in 'Zz' else zone}")
            return d.timestamp() + leap + round(float(fraction or 0.0), 6)
        except (ValueError, OverflowError):  # Feb 30, hour 25, +25:00
            raise bad from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimeError(f"{where}: {str(value)[:40]!r} is not a time (an RFC 3339 string or epoch seconds)")
    try:
        x = float(value)
    except OverflowError:
        raise TimeError(f"{where}: {str(value)[:20]}... is too large for epoch seconds") from None
    if not math.isfinite(x) or not EARLIEST <= x <= LATEST:
        raise _out_of_range(where, value, x)
    return x


def _out_of_range(where: str, value: object, x: float) -> TimeError:
    """Epoch seconds beyond the years 1-9999, with a hint where they read as milliseconds."""
    hint = " (epoch milliseconds? give seconds)" if LATEST < abs(x) <= 1000 * LATEST else ""
    return TimeError(f"{where}: {value!r} epoch seconds is not a time between the years 1 and 9999{hint}")


def parse_all(values: object, rows: int, what: str = "time") -> np.ndarray:
    """One time per row, strictly increasing, as float64 epoch seconds ``[rows]``."""
    if not isinstance(values, list):
        raise TimeError(f"'{what}' must be a list with one time per row")
    if len(values) != rows:
        raise TimeError(f"'{what}' has {len(values)} entries for {rows} rows")
    out = np.fromiter((parse(v, f"{what}[{i}]") for i, v in enumerate(values)), dtype=np.float64, count=rows)
    check_increasing(out, what)
    return out


def check_increasing(times: np.ndarray, what: str = "time") -> None:
    """Refuse out-of-range, repeated or decreasing times, naming the first at fault."""
    bad = ~((times >= EARLIEST) & (times <= LATEST))
    if bad.any():
        i = int(np.argmax(bad))
        raise _out_of_range(f"{what}[{i}]", float(times[i]), float(times[i]))
    if times.shape[0] > 1:
        step = np.diff(times)
        if not (step > 0).all():
            i = int(np.argmax(~(step > 0))) + 1
            how = "repeats" if step[i - 1] == 0 else "is before"
            raise TimeError(f"{what}[{i}] {how} {what}[{i - 1}] ({what}[{i}] = {format(times[i])}, {what}[{i - 1}] = "
                            f"{format(times[i - 1])}): times must be strictly increasing")


def format(t: float | None) -> str | None:  # noqa: A001 - the module's verb: times.format(t)
    """Epoch seconds as an RFC 3339 UTC string with microseconds (None stays None)."""
    if t is None:
        return None
    d = _EPOCH + timedelta(microseconds=round(t * 1e6))
    return d.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31557600.0}
_N = r"([0-9]+(?:\.[0-9]+)?)"  # ASCII digits only (\d would take other scripts' digits too)
_SHORT = re.compile(rf"^{_N}\s*([smhdwy])$")
_ISO = re.compile(rf"^P(?:{_N}W)?(?:{_N}D)?(?:T(?:{_N}H)?(?:{_N}M)?(?:{_N}S)?)?$")


def parse_duration(text: object, where: str = "duration") -> float:
    """A duration as seconds: ``90s``, ``15m``, ``12h``, ``30d``, ``2w``, ``10y`` (a year: 365.25
    days), or ISO 8601 ``PT12H``, ``P30D``, ``P1W``, ``P1DT6H`` (no ISO years or months: their
    length varies). Must be positive."""
    if not isinstance(text, str):
        raise TimeError(f"{where}: {str(text)[:40]!r} is not a duration such as '30d', '12h' or 'PT12H'")
    t = text.strip()
    m = _SHORT.match(t)
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        m = _ISO.match(t.upper())
        if not m or t.upper() in ("P", "PT") or t.upper().endswith("T"):
            raise TimeError(f"{where}: {t[:40]!r} is not a duration such as '30d', '12h', '90m', '45s', '2w', '10y' or "
                            "ISO 8601 'PT12H', 'P30D' (ISO years and months are not taken: their length varies)")
        seconds = sum(float(v) * u for v, u in zip(m.groups(), (604800.0, 86400.0, 3600.0, 60.0, 1.0)) if v)
    if not math.isfinite(seconds) or seconds <= 0:
        raise TimeError(f"{where}: {t[:40]!r} is not a positive duration")
    return seconds


def seconds_per_row(first: float | None, last: float, rows: int) -> float | None:
    """The mean time between a stream's rows: its ``rows`` rows so far span ``first`` to ``last``.
    None while that is not known or spans no time (one row, or one arrival-stamped chunk)."""
    if first is None or rows < 2 or not last > first:
        return None
    return (last - first) / (rows - 1)


def timed(location_time: float | None, detected_time: float | None) -> dict:
    """A change point's times as the API answers them: location_time, detected_time (RFC 3339) and
    delay_seconds (null where a time is unknown)."""
    delay = None if location_time is None or detected_time is None else detected_time - location_time
    return {"location_time": format(location_time), "detected_time": format(detected_time), "delay_seconds": delay}


def timed_withdrawal(location_time: float | None, withdrawn_time: float | None) -> dict:
    """A withdrawn change point's times as the API answers them: location_time and withdrawn_time
    (RFC 3339; null where unknown)."""
    return {"location_time": format(location_time), "withdrawn_time": format(withdrawn_time)}


def to_bytes(times: np.ndarray) -> bytes:
    return np.ascontiguousarray(times, dtype="<f8").tobytes()


def from_fields(fields: dict, rows: int) -> np.ndarray:
    """A stored input chunk's row times: its field ``t`` (the rows' own times, float64) or ``t0``
    (the chunk's arrival time, every row's)."""
    raw = fields.get(b"t")
    if raw:
        return np.frombuffer(raw, dtype="<f8").astype(np.float64)
    return np.full(rows, float(fields.get(b"t0") or 0.0))
