"""``ls`` and ``stats`` of a bucket queue: the views that start from listings, not from one job.

Why apart from :mod:`steadqd.s3.views`: ``inspect`` and ``show`` read one
job's graph; ``stats`` reads every plane's listing and judges each job from
its keys alone wherever it can (docs/stowq.md, "What stats counts"), and
``ls`` lists every shard's ids. Both fall back to the views' own rules
(:func:`steadqd.s3.views.derive`, :func:`~steadqd.s3.views.derive_live`)
for what a listing leaves open, so ``stats``, ``ls`` and ``show`` agree on a
job's state.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from steadqd.constants import State
from steadqd.errors import InvalidKey
from steadqd.s3 import keys
from steadqd.s3.keys import KeyKind, ParsedKey
from steadqd.s3.layout import QueueLayout
from steadqd.s3.records import ClaimRecord, FailRecord, JobRecord, QuarantineRecord
from steadqd.s3.store.base import ObjectMeta
from steadqd.s3.timemath import is_expired
from steadqd.s3.views import (
    QUARANTINE,
    STATS_STATES,
    Graph,
    chain_counts,
    derive,
    derive_live,
    iter_keys,
    own_shard,
    plane_prefix,
    read_graph,
    read_verified,
    shard_prefix,
)
from steadqd.view_records import JobEntry, StateStats, StateTally

__all__ = [
    "ENTRY_STATS_STATES",
    "STRAY",
    "entry_stats",
    "findings",
    "list_jobs",
    "listed_plane",
    "stats",
    "terminal_key",
]

# ``entry_stats`` keys (the reference's counting: running jobs are in ready).
ENTRY_STATS_STATES = ("dead", "delayed", "quarantine", "ready", "receipts")
# What stats counts a key under a plane as when no job's graph has it (the filesystem views' word).
STRAY = "stray"


@dataclass
class _Listed:
    job_time: int | None = None
    tail: tuple[int, int] | None = None  # (generation, store time)
    fails: set[int] = field(default_factory=set)
    receipt_time: int | None = None
    dead_time: int | None = None


@dataclass
class _Census:
    """What one LIST pass over each plane says (and the findings, which are read)."""

    jobs: dict[bytes, _Listed] = field(default_factory=dict)
    delayed: set[bytes] = field(default_factory=set)
    finding_times: list[int] = field(default_factory=list)
    quarantined: set[bytes] = field(default_factory=set)  # jobs a finding about a key of theirs names
    finding_sources: set[str] = field(default_factory=set)  # the relative keys the findings are about
    strays: list[tuple[str, int]] = field(default_factory=list)  # (relative key, store time)


def listed_plane(layout: QueueLayout, kind: KeyKind) -> Iterator[tuple[ParsedKey | None, ObjectMeta]]:
    """Every key under ``kind``'s plane, parsed when it is a key of that kind in its job's own shard, else None.

    None is a *stray*: a key that no job's graph has (no key of the grammar,
    another kind's shape, or a shard its job id does not map to, which
    readers ignore: :func:`keys.in_own_shard`). This is all a listing can
    tell; a record's key tag and fields are inside the object.
    """
    after: str | None = None
    while True:
        page = layout.list_page(plane_prefix(kind), start_after=after)
        for meta in page.items:
            try:
                parsed: ParsedKey | None = keys.parse_key(layout.relative(meta.key))
            except InvalidKey:
                parsed = None
            if parsed is not None and (parsed.kind is not kind or not own_shard(layout, parsed)):
                parsed = None
            yield parsed, meta
        if page.next_start_after is None:
            return
        after = layout.relative(page.next_start_after)


def _census(layout: QueueLayout) -> _Census:
    """One LIST pass over each plane: per job what its keys say, delayed ids, the findings, and the strays."""
    c = _Census()

    def listed(kind: KeyKind) -> Iterator[tuple[ParsedKey, int]]:
        for parsed, meta in listed_plane(layout, kind):
            if parsed is None:
                c.strays.append((layout.relative(meta.key), meta.store_time_ns))
            else:
                yield parsed, meta.store_time_ns

    def entry(parsed: ParsedKey) -> _Listed:
        assert parsed.job_id is not None
        return c.jobs.setdefault(parsed.job_id, _Listed())

    for parsed, t in listed(KeyKind.JOB):
        entry(parsed).job_time = t
    for parsed, t in listed(KeyKind.CLAIM):
        assert parsed.generation is not None
        entry(parsed).tail = (parsed.generation, t)  # key order: the last listed is the tail
    for parsed, _ in listed(KeyKind.FAIL):
        assert parsed.generation is not None
        entry(parsed).fails.add(parsed.generation)
    for parsed, t in listed(KeyKind.RECEIPT):
        entry(parsed).receipt_time = t
    for parsed, t in listed(KeyKind.DEAD):
        entry(parsed).dead_time = t
    c.delayed = {p.job_id for p, _ in listed(KeyKind.DELAY_INDEX) if p.job_id is not None}
    _read_findings(layout, c, listed(KeyKind.QUARANTINE))
    return c


def _read_findings(layout: QueueLayout, c: _Census, listed: Iterable[tuple[ParsedKey, int]]) -> None:
    """Each listed finding's time, the key it is about, and the job that key is of (a GET each)."""
    for parsed, t in listed:
        c.finding_times.append(t)
        record, _, _ = read_verified(layout, str(parsed))
        if isinstance(record, QuarantineRecord):
            c.finding_sources.add(record.source_key)
            try:
                source = keys.parse_key(record.source_key)
            except InvalidKey:
                continue
            if source.job_id is not None and own_shard(layout, source):  # a stray key names no job
                c.quarantined.add(source.job_id)


def findings(layout: QueueLayout) -> _Census:
    """The findings alone (one LIST pass over quarantine/, a GET each): what ``ls`` needs of the census."""
    c = _Census()
    _read_findings(layout, c, ((p, m.store_time_ns) for p, m in listed_plane(layout, KeyKind.QUARANTINE) if p))
    return c


def terminal_key(layout: QueueLayout, job_id: bytes, receipt: bool) -> str:
    """The job's receipt or dead key in its own shard."""
    shard = keys.shard_of(layout.queue_id, job_id, layout.format.shard_count)
    return keys.receipt_key(shard, job_id) if receipt else keys.dead_key(shard, job_id)


def _live_state(layout: QueueLayout, job_id: bytes, e: _Listed, delayed: set[bytes], floor_ns: int) -> str:
    """ready, delayed or leased for a job the listings could not decide alone (at most 3 GETs)."""
    if e.tail is None and job_id not in delayed:
        return "ready"  # never claimed and not indexed as delayed: no GET
    g = Graph(keys.shard_of(layout.queue_id, job_id, layout.format.shard_count), job_id)
    record, _, problem = read_verified(layout, g.job_rel)
    if problem is not None or not isinstance(record, JobRecord):
        return QUARANTINE
    g.job, g.job_time = record, e.job_time
    if e.tail is not None:
        generation, tail_time = e.tail
        g.claims = [e.tail]
        tail, _, problem = read_verified(layout, keys.claim_key(g.shard, job_id, generation))
        if problem is not None or not isinstance(tail, ClaimRecord):
            return QUARANTINE
        g.tail = tail
        if generation in e.fails and not is_expired(floor_ns, tail_time, tail.lease_duration_ns, 0):
            return "delayed"  # nacked, and its lease has not run out: no takeover before it does
        if generation in e.fails:
            fail, _, problem = read_verified(layout, keys.fail_key(g.shard, job_id, generation))
            if problem is not None or not isinstance(fail, FailRecord):
                return QUARANTINE
            g.tail_fail = fail
    return derive_live(layout, g, floor_ns).state


def stats(layout: QueueLayout, floor_ns: int) -> dict[str, StateStats]:
    """Jobs per state (STATS_STATES), quarantine findings, and strays; ages by store time against the floor.

    The one definition of a done or dead job, as far as a listing can check
    it (docs/stowq.md, "What stats counts"): its key in its job's own shard
    (:func:`listed_plane`), a receipt key deciding over a dead key, and no
    finding about that key. ``ls``, ``admin requeue`` and ``admin purge``
    select by the same rule (they read the job's own-shard keys, the receipt
    first) and also verify the record; a key that fails is counted here
    until a finding about it is recorded (``fsck --repair``), then under
    ``quarantine`` only. A key that no job's graph has (no key of the
    grammar, or under a shard its id does not map to) is a ``stray``, a key
    present only when there is one, unless a finding about it counts it.

    Cost: one LIST pass over each of jobs/, claims/, fails/, receipts/,
    dead/, delayed/ and quarantine/ (a page per 1,000 keys), one GET per
    finding, and GETs only for jobs the listings leave open: a job with a
    claim chain (its tail claim, and its fail record when the tail was
    nacked) or a delayed/ entry (its record). A job never claimed and not
    indexed as delayed is counted ready without a GET, so a job whose
    delayed/ entry was lost counts as ready until the repair scan restores
    it (``ls`` and ``show`` read its record). ``tmp`` is always 0: a create
    is atomic, nothing is ever half-written.
    """
    c = _census(layout)
    tallies = {k: StateTally() for k in STATS_STATES}
    for job_id, e in c.jobs.items():
        if e.receipt_time is not None or e.dead_time is not None:
            receipt, t = (True, e.receipt_time) if e.receipt_time is not None else (False, e.dead_time)
            if terminal_key(layout, job_id, receipt) not in c.finding_sources:  # else: counted by its finding
                tallies["receipts" if receipt else "dead"].add(t)
            continue
        if e.job_time is None or job_id in c.quarantined:
            continue  # an orphan graph or a quarantined job: counted by its finding
        state = _live_state(layout, job_id, e, c.delayed, floor_ns)
        if state != QUARANTINE:
            tallies[state].add(e.job_time)
    for t in c.finding_times:
        tallies["quarantine"].add(t)
    for rel, t in c.strays:
        if rel not in c.finding_sources:
            tallies.setdefault(STRAY, StateTally()).add(t)
    return {k: t.result(floor_ns) for k, t in tallies.items()}


def entry_stats(layout: QueueLayout, floor_ns: int) -> dict[str, StateStats]:
    """:func:`stats` counted as the filesystem reference counts: running (leased) jobs are in ready.

    The same cost as :func:`stats`; ``tmp`` and a separate ``leased`` line
    are left out, as a filesystem queue without those directories prints.
    """
    s = stats(layout, floor_ns)
    ready, leased = s["ready"], s["leased"]
    ages = [a for a in (ready.oldest_age_seconds, leased.oldest_age_seconds) if a is not None]
    merged = StateStats(ready.objects + leased.objects, max(ages) if ages else None)
    return {k: merged if k == "ready" else s[k] for k in (*ENTRY_STATS_STATES, STRAY) if k in s}


# =========================================================================== ls


_TERMINAL_STATES = frozenset({State.DEAD.value, State.RECEIPT.value})


def _listed_jobs(layout: QueueLayout, shard: int, terminal_only: bool) -> Iterator[bytes]:
    """The job ids of one shard in id order, from its per-shard planes (a graph without a job record too)."""
    kinds: tuple[KeyKind, ...] = (KeyKind.DEAD, KeyKind.RECEIPT)
    if not terminal_only:
        kinds = (KeyKind.JOB, KeyKind.CLAIM, *kinds)
    ids: set[bytes] = set()
    for kind in kinds:
        for parsed, _ in iter_keys(layout, shard_prefix(kind, shard)):
            if parsed.job_id is not None and own_shard(layout, parsed):
                ids.add(parsed.job_id)
    yield from sorted(ids)


def list_jobs(layout: QueueLayout, states: Collection[str], floor_ns: int) -> Iterator[JobEntry]:
    """Every job in ``states`` (ready, leased, delayed, dead, receipt), streamed shard by shard.

    Cost: 4 LISTs per shard (jobs, claims, receipts, dead; a page per
    1,000 keys; only the last two when only dead or done jobs are wanted),
    then :func:`read_graph` for each job found, so a listing of N jobs
    makes about N × (2 LISTs + 3 to 5 GETs). Memory holds one shard's ids.
    A job in quarantine is not listed (``stats`` counts the findings,
    ``show`` tells its story): one whose objects fail verification, and,
    by ``stats``' rule, one a finding names (a live job a finding about any
    key of it names, a done or dead job a finding about its receipt or dead
    key), which costs one more LIST pass over quarantine/ and a GET per
    finding.
    """
    wanted = set(states)
    found = findings(layout)
    for shard in range(layout.format.shard_count):
        for job_id in _listed_jobs(layout, shard, wanted <= _TERMINAL_STATES):
            g = read_graph(layout, job_id)
            d = derive(layout, g, floor_ns)
            if d is None or d.state not in wanted:
                continue
            if d.path in found.finding_sources if d.state in _TERMINAL_STATES else job_id in found.quarantined:
                continue  # counted under quarantine, by its finding
            generation, attempt, maximum = chain_counts(g)
            yield JobEntry(d.state, job_id.hex(), generation, attempt, maximum, d.path, d.since_ns, d.deadline_ns,
                           d.reason)  # fmt: skip
