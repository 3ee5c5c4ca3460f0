"""What ``steadq fsck`` reports, whichever backend checked the queue.

Why one home: the command prints every backend's findings the same way
(``<severity> <path>: <finding_type> (<details>)``, cli.md) and exits 3 on
the same rule, so a finding's shape and the exit rule are one fact, not a
copy per backend. A backend with more to count (a bucket regenerates
indexes) extends :class:`FsckResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Finding", "FsckResult"]


@dataclass(frozen=True)
class Finding:
    """One fsck observation; ``path`` is relative to the queue root.

    ``reason`` is the quarantine reason a bucket records with a finding;
    a filesystem queue's findings carry none.
    """

    severity: str  # "ERROR" | "WARN"
    path: str
    finding_type: str
    details: str
    reason: int | None = None


@dataclass
class FsckResult:
    """Counts and findings of one fsck run."""

    total_objects: int = 0
    structurally_verified: int = 0
    payloads_deep_verified: int = 0
    findings: list[Finding] = field(default_factory=list)
    quarantined: int = 0

    @property
    def exit_code(self) -> int:
        """cli.md: 3 if any ERROR exists (even one that was repaired or recorded as a quarantine finding), else 0."""
        return 3 if any(f.severity == "ERROR" for f in self.findings) else 0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "ERROR"]
