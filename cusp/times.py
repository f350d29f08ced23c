"""Row times for ``cusp.Client.post`` (and ``detect``), checked here before anything is sent, and
the service's answers read back as ``datetime``.

A stream's rows may carry one time each (the service stamps rows without them with their arrival
time). ``times`` takes, one per row, strictly increasing:

- ``datetime`` with a time zone (a naive one is refused: which zone would it be in?), or a
  ``date`` (midnight UTC); pandas ``Timestamp`` is a ``datetime`` and works the same;
- RFC 3339 strings with an offset or ``Z`` (``"2026-11-26T08:00:00Z"``), or dates ``"2026-11-26"``
  (midnight UTC);
- epoch seconds (numbers);
- numpy ``datetime64`` values or arrays, which numpy defines as UTC; a pandas ``DatetimeIndex`` or
  datetime Series with a time zone (a tz-naive one is refused, as a naive datetime is).

``datetime`` and ``datetime64`` values are sent as RFC 3339 UTC strings with microseconds (what the
service keeps: its times are float64 epoch seconds, microseconds exact for 285 years around 1970);
strings and numbers are sent as given. pandas is never imported here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from typing import Any

from cusp.errors import InputError

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_time(value: str | None) -> datetime | None:
    """A time from the service (``time_start``, ``location_time``, ``detected_time``...: RFC 3339
    UTC strings) as a timezone-aware ``datetime`` in UTC; None (a result without time) stays None."""
    if value is None:
        return None
    return _EPOCH + timedelta(microseconds=round(_service_seconds(value, "time") * 1e6))


def wire_times(times: Any, rows: int, what: str = "times") -> list:
    """``times`` as the JSON list the service takes: one per row (``rows`` of them), each valid and
    each after the one before, else ``InputError`` naming the first at fault."""
    return [wire for wire, _ in _checked(times, rows, what)]


def epoch_seconds(times: Any, rows: int, what: str = "times") -> list[float]:
    """``times`` as epoch seconds, checked as ``wire_times`` checks them (``cusp.Detector``)."""
    return [seconds for _, seconds in _checked(times, rows, what)]


def _checked(times: Any, rows: int, what: str) -> list[tuple[Any, float]]:
    """(what to send, epoch seconds) per time, or InputError."""
    values = _items(times, what)
    if len(values) != rows:
        raise InputError(f"{what} has {len(values)} entries for {rows} rows: give one time per row")
    out, previous = [], None
    for i, v in enumerate(values):
        wire, seconds = _one(v, f"{what}[{i}]")
        if previous is not None and not seconds > previous:
            how = "repeats" if seconds == previous else "is before"
            raise InputError(f"{what}[{i}] {how} {what}[{i - 1}] ({what}[{i}] = {_show(values[i])}, {what}[{i - 1}] = "
                             f"{_show(values[i - 1])}): times must be strictly increasing")
        out.append((wire, seconds))
        previous = seconds
    return out


def _items(times: Any, what: str) -> list:
    """The times as a list of single values; datetime64 arrays and tz-aware pandas objects become
    RFC 3339 strings (``_utc_strings``)."""
    if hasattr(times, "tz") and hasattr(times, "tz_convert"):  # a pandas DatetimeIndex
        if times.tz is None:
            raise InputError(f"{what} is a tz-naive DatetimeIndex: say its zone first (times.tz_localize('UTC'))")
        return _utc_strings(times.tz_convert("UTC").tz_localize(None).to_numpy(), what)
    dt = getattr(getattr(times, "dt", None), "tz", False)  # a pandas Series of datetimes
    if dt is not False:
        if dt is None:
            raise InputError(f"{what} is a tz-naive datetime Series: say its zone first (times.dt.tz_localize('UTC'))")
        return _utc_strings(times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy(), what)
    kind = getattr(getattr(times, "dtype", None), "kind", None)
    if kind == "M":  # numpy datetime64: UTC by numpy's definition
        return _utc_strings(times, what)
    if hasattr(times, "tolist") and not isinstance(times, (list, str)):
        times = times.tolist()  # numbers in an array
    if isinstance(times, (str, bytes)) or not isinstance(times, Sequence):
        raise InputError(f"{what} must be a list with one time per row (datetimes, RFC 3339 strings or epoch "
                         f"seconds), got {type(times).__name__}")
    return list(times)


def _utc_strings(a: Any, what: str) -> list[str]:
    import numpy as np

    a = np.asarray(a)
    if a.ndim != 1:
        raise InputError(f"{what} must be one-dimensional, one time per row; got an array of shape {a.shape}")
    nat = np.isnat(a)
    if nat.any():
        raise InputError(f"{what}[{int(np.argmax(nat))}] is NaT (not a time)")
    return list(np.datetime_as_string(a.astype("datetime64[us]"), unit="us", timezone="UTC"))


def _one(v: Any, where: str) -> tuple[Any, float]:
    """What to send for one time, and its epoch seconds (for the order check)."""
    if isinstance(v, str):
        return v, _service_seconds(v, where)
    if isinstance(v, datetime):
        if v.tzinfo is None or v.utcoffset() is None:
            raise InputError(f"{where}: {v!r} is a naive datetime; give it a time zone "
                             "(datetime(..., tzinfo=timezone.utc), or .astimezone())")
        utc = v.astimezone(timezone.utc)
        return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z", _seconds(utc, where)
    if isinstance(v, date):
        return v.isoformat(), _seconds(datetime(v.year, v.month, v.day, tzinfo=timezone.utc), where)
    if type(v).__name__ == "datetime64":
        return _one(_utc_strings([v], where)[0], where)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InputError(f"{where}: {v!r} is not a time (a timezone-aware datetime, an RFC 3339 string or epoch seconds)")
    try:
        f = float(v)
    except OverflowError:  # an integer beyond float64 (10**400): out of the years any time has
        f = math.inf if v > 0 else -math.inf
    x = _service_seconds(f, where)
    return (int(v) if isinstance(v, numbers.Integral) else x), x


def _service_seconds(v: str | float, where: str) -> float:
    """An RFC 3339 string, a date or epoch seconds read exactly as the service reads them
    (``service.times.parse``: the same forms, the same bounds, the same messages), so that what
    passes here is never refused there."""
    from service.times import TimeError, parse  # here: ``import cusp`` stays light

    try:
        return parse(v, where)
    except TimeError as exc:
        raise InputError(str(exc)) from None


def _seconds(d: datetime, where: str) -> float:
    try:
        return d.timestamp()
    except (OverflowError, ValueError, OSError):
        raise InputError(f"{where}: {d!r} is not a time between the years 1 and 9999") from None


def _show(v: Any) -> str:
    return repr(v) if not isinstance(v, datetime) else v.isoformat()
