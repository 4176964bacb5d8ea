"""Parsers for PostgreSQL's text output of types that Arrow cannot cast directly.

Every capture session runs with ``DateStyle=ISO``, ``TimeZone=UTC``, ``IntervalStyle=iso_8601``,
``lc_monetary=C`` and ``bytea_output=hex`` (see ``types.SESSION_SETTINGS``), so each type has
exactly one text form, parsed here without locale or time-zone guesswork. Dates and
timestamps are converted to days and microseconds since the Unix epoch on the proleptic
Gregorian calendar (PostgreSQL's own), which covers BC dates and years beyond 9999 that
``datetime`` cannot hold. Hand-written because no library parses PostgreSQL's output forms
(``BC`` suffixes, ``24:00:00``, ISO-8601 intervals with mixed signs, array and hstore quoting).
"""

from __future__ import annotations

import re
from decimal import Decimal

US_PER_SECOND = 1_000_000
US_PER_DAY = 86_400 * US_PER_SECOND
#: Debezium's interval conversion: an average month of 365.25 / 12 days.
DAYS_PER_MONTH_AVG = 365.25 / 12

INFINITY = "infinity"
NEG_INFINITY = "-infinity"

_DATE = re.compile(r"^(\d{4,})-(\d{2})-(\d{2})( BC)?$")
_TIMESTAMP = re.compile(
    r"^(\d{4,})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?([+-]\d{2}(?::?\d{2}(?::?\d{2})?)?)?( BC)?$"
)
_TIME = re.compile(r"^(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?([+-]\d{2}(?::?\d{2}(?::?\d{2})?)?)?$")
_INTERVAL = re.compile(
    r"^P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?$"
)


class ParseError(ValueError):
    """Text that is not PostgreSQL's output form of the expected type."""


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (year 0 = 1 BC)."""
    year -= month <= 2
    era = year // 400  # Python's // floors; the C original needs (year - 399) / 400 for that
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Inverse of :func:`days_from_civil`."""
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    year = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return year + (month <= 2), month, day


def _year(digits: str, bc: str | None) -> int:
    year = int(digits)
    return 1 - year if bc else year  # 1 BC is year 0


def parse_date(text: str) -> int | str:
    """Days since the epoch, or ``'infinity'`` / ``'-infinity'``."""
    if text in (INFINITY, NEG_INFINITY):
        return text
    match = _DATE.match(text)
    if not match:
        raise ParseError(f"not a PostgreSQL date: {text!r}")
    year, month, day, bc = match.groups()
    return days_from_civil(_year(year, bc), int(month), int(day))


def _fraction_us(fraction: str | None) -> int:
    return int((fraction or "").ljust(6, "0")) if fraction else 0


def _offset_seconds(offset: str | None) -> int:
    if not offset:
        return 0
    sign = -1 if offset[0] == "-" else 1
    parts = offset[1:].replace(":", "")
    hours, minutes, seconds = int(parts[0:2]), int(parts[2:4] or 0), int(parts[4:6] or 0)
    return sign * (hours * 3600 + minutes * 60 + seconds)


def parse_timestamp(text: str) -> int | str:
    """Microseconds since the epoch (UTC for ``timestamptz``), or ``'infinity'``/``'-infinity'``."""
    if text in (INFINITY, NEG_INFINITY):
        return text
    match = _TIMESTAMP.match(text)
    if not match:
        raise ParseError(f"not a PostgreSQL timestamp: {text!r}")
    year, month, day, hour, minute, second, fraction, offset, bc = match.groups()
    days = days_from_civil(_year(year, bc), int(month), int(day))
    seconds = int(hour) * 3600 + int(minute) * 60 + int(second) - _offset_seconds(offset)
    return days * US_PER_DAY + seconds * US_PER_SECOND + _fraction_us(fraction)


def parse_time(text: str) -> int:
    """Microseconds since midnight (``24:00:00`` is a valid PostgreSQL time: 86 400 000 000)."""
    match = _TIME.match(text)
    if not match or match.group(5):
        raise ParseError(f"not a PostgreSQL time: {text!r}")
    hour, minute, second, fraction, _ = match.groups()
    return (int(hour) * 3600 + int(minute) * 60 + int(second)) * US_PER_SECOND + _fraction_us(fraction)


def parse_timetz(text: str) -> tuple[int, int]:
    """(microseconds since midnight local, UTC offset in seconds)."""
    match = _TIME.match(text)
    if not match or not match.group(5):
        raise ParseError(f"not a PostgreSQL time with time zone: {text!r}")
    hour, minute, second, fraction, offset = match.groups()
    local = (int(hour) * 3600 + int(minute) * 60 + int(second)) * US_PER_SECOND + _fraction_us(fraction)
    return local, _offset_seconds(offset)


def iso_fraction(micros: int) -> str:
    """Java's ISO-8601 fraction: none, 3 or 6 digits, as many as needed."""
    if micros == 0:
        return ""
    if micros % 1000 == 0:
        return f".{micros // 1000:03d}"
    return f".{micros:06d}"


def format_timestamp(micros: int, *, zoned: bool) -> str:
    """PostgreSQL's own text output (``DateStyle=ISO``, ``TimeZone=UTC``) of a finite
    timestamp given as microseconds since 1970: ``2024-01-02 03:04:05.5+00``, ``... BC``."""
    days, rest = divmod(micros, US_PER_DAY)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(rest, US_PER_SECOND)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    digits = f".{fraction:06d}".rstrip("0") if fraction else ""
    text = f"{year if year > 0 else 1 - year:04d}-{month:02d}-{day:02d} {hours:02d}:{minutes:02d}:{seconds:02d}{digits}"
    return text + ("+00" if zoned else "") + ("" if year > 0 else " BC")


def format_zoned_timestamp(micros: int) -> str:
    """Debezium's ``ZonedTimestamp``: ISO-8601 in UTC, e.g. ``2018-06-20T13:13:16.945104Z``."""
    days, rest = divmod(micros, US_PER_DAY)
    year, month, day = civil_from_days(days)
    seconds, fraction = divmod(rest, US_PER_SECOND)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    year_text = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+05d}"
    return f"{year_text}-{month:02d}-{day:02d}T{hours:02d}:{minutes:02d}:{seconds:02d}{iso_fraction(fraction)}Z"


def format_zoned_time(local_us: int, offset_seconds: int) -> str:
    """Debezium's ``ZonedTime``: the time in UTC, e.g. ``07:44:15.5Z``."""
    utc = (local_us - offset_seconds * US_PER_SECOND) % US_PER_DAY
    seconds, fraction = divmod(utc, US_PER_SECOND)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{iso_fraction(fraction)}Z"


def parse_interval(text: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of an ISO-8601 interval as PostgreSQL prints it."""
    match = _INTERVAL.match(text)
    if not match or text in ("P", "PT"):
        raise ParseError(f"not a PostgreSQL interval (IntervalStyle iso_8601): {text!r}")
    years, months, days, hours, minutes, seconds = match.groups()
    total_months = int(years or 0) * 12 + int(months or 0)
    micros = (int(hours or 0) * 3600 + int(minutes or 0) * 60) * US_PER_SECOND
    if seconds:
        micros += int(Decimal(seconds) * US_PER_SECOND)
    return total_months, int(days or 0), micros


def interval_micros(text: str) -> int:
    """Debezium's ``MicroDuration``: approximate microseconds, 365.25 / 12 days a month."""
    months, days, micros = parse_interval(text)
    return round(months * DAYS_PER_MONTH_AVG * US_PER_DAY) + days * US_PER_DAY + micros


def parse_money(text: str) -> Decimal:
    """``-$1,234.56`` (``lc_monetary=C``) → ``Decimal('-1234.56')``."""
    cleaned = text.replace("$", "").replace(",", "").strip()
    negative = cleaned.startswith("-") or (cleaned.startswith("(") and cleaned.endswith(")"))
    cleaned = cleaned.strip("-()").strip()
    try:
        value = Decimal(cleaned)
    except ArithmeticError:
        raise ParseError(f"not a PostgreSQL money value: {text!r}") from None
    return -value if negative else value


def parse_point(text: str) -> tuple[float, float]:
    if not (text.startswith("(") and text.endswith(")")):
        raise ParseError(f"not a PostgreSQL point: {text!r}")
    x, _, y = text[1:-1].partition(",")
    return float(x), float(y)


def parse_array(text: str) -> list[str | None]:
    """Elements of a one-dimensional array's text form (``NULL`` → None, quotes resolved)."""
    if text.startswith("["):  # explicit bounds, e.g. [0:1]={1,2}
        text = text[text.index("=") + 1 :]
    if not (text.startswith("{") and text.endswith("}")):
        raise ParseError(f"not a PostgreSQL array: {text!r}")
    body = text[1:-1]
    if not body:
        return []
    if body.startswith("{"):
        raise ParseError("multi-dimensional arrays are not mapped element by element")
    out: list[str | None] = []
    i, n = 0, len(body)
    while i <= n:
        if i < n and body[i] == '"':
            element, i = _read_quoted(body, i)
            out.append(element)
        else:
            end = body.find(",", i)
            end = n if end == -1 else end
            raw = body[i:end]
            out.append(None if raw == "NULL" else raw)
            i = end
        if i < n and body[i] != ",":
            raise ParseError(f"unexpected {body[i]!r} in array {text!r}")
        i += 1
    return out


def parse_hstore(text: str) -> list[tuple[str, str | None]]:
    """Pairs of an hstore's text form: ``"a"=>"1", "b"=>NULL``."""
    pairs: list[tuple[str, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        key, i = _read_quoted(text, i)
        if text[i : i + 2] != "=>":
            raise ParseError(f"expected '=>' in hstore {text!r}")
        i += 2
        if text.startswith("NULL", i):
            value, i = None, i + 4
        else:
            value, i = _read_quoted(text, i)
        pairs.append((key, value))
        if i < n:
            if text[i : i + 2] != ", ":
                raise ParseError(f"expected ', ' in hstore {text!r}")
            i += 2
    return pairs


def _read_quoted(text: str, pos: int) -> tuple[str, int]:
    """A double-quoted string with backslash escapes (array elements, hstore keys and values)
    starting at ``pos``; returns it and the position after the closing quote."""
    if pos >= len(text) or text[pos] != '"':
        raise ParseError(f"expected a quoted string at {pos} in {text!r}")
    chars = []
    pos += 1
    while True:
        if pos >= len(text):
            raise ParseError(f"unterminated quoted string in {text!r}")
        ch = text[pos]
        if ch == "\\":
            chars.append(text[pos + 1])
            pos += 2
        elif ch == '"':
            return "".join(chars), pos + 1
        else:
            chars.append(ch)
            pos += 1
