"""Reading the daemon's log: the ``<N>role[queue]: message KEY=value ...`` lines on its stderr.

``steadqd run`` without a journal writes each journal entry as one such line
(daemon/journal.py). The demo parses them to pick which to show, to shorten
them for a terminal, and to count what the log says happened: the retries it
reports are checked against the plan, the tree's counts against the rest.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_LINE = re.compile(r"^<(?P<prio>\d)>(?P<role>[\w-]+)\[(?P<queue>[^\]]*)\]: (?P<rest>.*)$")
_FIELD = re.compile(r"\s(STEADQ_[A-Z0-9_]+)=('(?:[^'\\]|\\.)*'|\S+)")
# The worker's sentences about a job (daemon/worker/settle.py): "job 3d1f6a0c finished: ack (...)" and its follow-ups.
_FINISHED = re.compile(r"job \S+ finished: (\w+)")
_RETRIED = re.compile(r"job \S+ retried: ")
_BURIED = re.compile(r"job \S+ buried: ")


@dataclass
class LogLine:
    """One daemon stderr line, parsed (``<N>role[queue]: message KEY=value ...``)."""

    raw: str
    priority: int = 6
    message: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    prefix: str = ""  # "<6>run[demo]:"; empty for unprefixed output

    @classmethod
    def parse(cls, raw: str) -> LogLine:
        m = _LINE.match(raw)
        if m is None:  # a traceback or other unprefixed output
            return cls(raw, 3, raw)
        rest = m["rest"]
        fields = {k: v.strip("'") for k, v in _FIELD.findall(" " + rest)}
        first = _FIELD.search(" " + rest)
        message = rest if first is None else (" " + rest)[: first.start()].strip()
        return cls(raw, int(m["prio"]), message, fields, f"<{m['prio']}>{m['role']}[{m['queue']}]:")

    def short(self) -> str:
        """The line as shown on screen: STEADQ_ prefixes dropped, job ids cut to 12 hex digits.

        ``daemon.log`` keeps the lines verbatim; this only keeps a terminal
        line readable (a job id is 32 hex digits, and 12 identify it here).
        """
        if not self.prefix:
            return self.raw
        parts = [self.prefix, self.message]
        for k, v in sorted(self.fields.items()):
            if k == "STEADQ_PATH":
                continue
            if k == "STEADQ_JOB_ID" and len(v) > 12:
                v = v[:12] + "…"
            parts.append(f"{k.removeprefix('STEADQ_')}={v}")
        return " ".join(parts)


@dataclass
class Tally:
    """What the daemon's log says happened (cross-checked against the tree)."""

    finished: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    buried: int = 0
    promoted: int = 0
    lines: int = 0
    errors: int = 0
    recovery_passes: int = 0
    shown_finishes: int = 0
    shown_outputs: int = 0
    shown_complaints: int = 0

    def feed(self, line: LogLine) -> bool:
        """Count ``line``; return True if the demo should show it."""
        self.lines += 1
        msg = line.message
        if m := _FINISHED.match(msg):
            self.finished[m[1]] += 1
            if line.fields.get("STEADQ_VERDICT") == "ack" and self.shown_finishes < 3:
                self.shown_finishes += 1
                return True
            return False
        stream = line.fields.get("STEADQ_STREAM")
        if stream == "stdout":  # a job's own output, forwarded with its fields
            if self.shown_outputs < 3:
                self.shown_outputs += 1
                return True
            return False
        if stream == "stderr":
            if self.shown_complaints < 3:
                self.shown_complaints += 1
                return True
            return False
        if msg.startswith("recovery pass"):  # the sweeper; the first pass compacts old receipts
            self.recovery_passes += 1
            return self.recovery_passes == 1 or any(
                line.fields.get(f"STEADQ_{k}", "0") != "0" for k in ("REAPED", "TO_DEAD", "QUARANTINED", "TEMP_DELETED")
            )
        if _RETRIED.match(msg):
            self.retried += 1
            return True
        if _BURIED.match(msg):
            self.buried += 1
            return True
        if msg.startswith("promoted "):
            self.promoted += int(line.fields.get("STEADQ_PROMOTED", "0"))
            return True
        if line.priority <= 3:
            self.errors += 1
            return True
        # Notices: started, recovery passes, stopping, stopped. Job output on
        # stderr (flaky/poison explaining themselves) and "job started" are in
        # daemon.log but would drown the rest.
        return line.priority <= 5
