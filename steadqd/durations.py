"""Human durations ("90s", "2h", "1d12h", "250ms") shared by the CLI and the config."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | int | float) -> float:
    """Seconds from a number or a string of <number><unit> parts.

    Raises ValueError naming the value; a bare number means seconds.
    Negative values, NaN and unknown units are refused.
    """
    if isinstance(text, bool):
        raise ValueError(f"invalid duration {text!r}: expected e.g. 30s, 5m, 2h, 1d")
    if isinstance(text, int | float):
        value = float(text)
    else:
        s = text.strip().lower()
        if not s.isascii():  # float() and \d accept any Unicode digit: "١s" is not a duration here
            raise ValueError(f"invalid duration {text!r}: expected e.g. 30s, 5m, 2h, 1d, 1h30m")
        try:
            value = float(s)
        except ValueError:
            pos, value = 0, 0.0
            for m in _PART.finditer(s):
                if m.start() != pos:
                    break
                value += float(m.group(1)) * _UNITS[m.group(2)]
                pos = m.end()
            if pos != len(s) or not s:
                raise ValueError(f"invalid duration {text!r}: expected e.g. 30s, 5m, 2h, 1d, 1h30m") from None
    if value != value or value < 0 or value == float("inf"):
        raise ValueError(f"invalid duration {text!r}: must be a finite, non-negative number of seconds")
    return value


def format_duration(seconds: float) -> str:
    """Compact rendering for status lines and listings: 45s, 3m20s, 2h5m, 3d4h."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            major, rest = divmod(s, size)
            minor = rest // subsize
            return f"{major}{unit}{minor}{sub}" if minor else f"{major}{unit}"
    return f"{s}s"
