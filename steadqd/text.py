"""Text that came from a queue or a job, made safe for a terminal or a text log.

File names in a tree are chosen by whoever can write the queue, and a job's
output by whatever the job runs. Printed raw, a control character can drive
the terminal (ESC sequences), and a newline, CR or U+2028 can forge a line of
output or of a log. Both the ``steadq`` command and the daemons' stderr log
print through :func:`printable`; JSON output is escaped by the encoder.
"""

from __future__ import annotations

import re

__all__ = ["printable", "redacted"]

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and lone
# surrogates: a name that is not UTF-8 arrives as surrogateescape, which a
# stream would write back out as the raw byte (0x9b is CSI to an 8-bit terminal).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
# The surrogates surrogateescape makes of the bytes 0x80-0xff.
_ESCAPED_BYTE = range(0xDC80, 0xDD00)


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _SHORT:
        return _SHORT[ch]
    c = ord(ch)
    if c in _ESCAPED_BYTE:
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """``text`` with every control character escaped as Python would (``\\n``, ``\\x1b``, ``\\u2028``),
    and every byte that was not UTF-8 as ``\\xNN``."""
    return _UNPRINTABLE.sub(_escape_char, text)


# The userinfo of a URL (``http://user:pass@host``): everything between ``//`` and the last ``@``
# before the path, so an unencoded ``@`` in a password is hidden too.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s?#\"'<>]*@")
# Query parameters that carry a secret: a presigned URL's signature and credentials, and the usual names.
_SECRET_PARAM = re.compile(
    r"([?&](?:X-Amz-(?:Signature|Credential|Security-Token)|AWSAccessKeyId|Signature|password|passwd|pwd|"
    r"secret|token|access_token|api_key|apikey)=)[^&\s#\"'<>]*",
    re.IGNORECASE,
)


def redacted(text: str) -> str:
    """``text`` with the secrets of every URL in it hidden as ``***``: the userinfo and secret query values.

    Why one function for any text: an endpoint reaches the operator inside
    messages built by botocore and by us alike (``Could not connect to the
    endpoint URL: "http://user:pass@host/..."``), so the CLI's error lines and
    the daemons' log lines pass through it, as does every place that names a
    store (``S3Store.location``). A bare ``user@host`` without a scheme is left.
    """
    if "://" in text:  # a userinfo needs a scheme's "://"
        text = _USERINFO.sub(r"\1***@", text)
    if "=" in text:  # a secret parameter needs its "=" (most log fields have neither: no regex run for them)
        text = _SECRET_PARAM.sub(r"\1***", text)
    return text
