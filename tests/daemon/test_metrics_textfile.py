"""The node-exporter textfile (issue 16, point 7), written by a real ``steadqd run``.

The file must be valid Prometheus text exposition format line by line (a
node-exporter that meets one bad line drops the whole file), replaced
atomically, and count what happened: jobs acked, retried, buried, failed to
start; promotions; reaps; the run-time histogram.
"""

from __future__ import annotations

import io
import math
import os
import re
import signal
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from steadqd import Queue
from steadqd.daemon import metrics
from steadqd.daemon.config import load_config
from steadqd.daemon.journal import Log
from steadqd.daemon.metrics import DURATION_BUCKETS, Metrics, UncontrolledDirectory, textfile_for, write_textfile
from steadqd.daemon.preflight import metrics_problems
from steadqd.daemon.problem import Account
from steadqd.daemon.settings import QueueSettings
from steadqd.daemon.sweeper import SweeperRole
from tests.daemon.conftest import STEADQD, Daemon, Env, job_spec, traversable, wait_for
from tests.integration.test_shared_queue import PRODUCER, QUEUE_GID, as_user

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
_VALUE = r"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|Inf)|NaN)"
_SAMPLE = re.compile(rf"({_NAME})(?:\{{({_LABEL}(?:,{_LABEL})*)?\}})? ({_VALUE})(?: -?[0-9]+)?")
_HELP = re.compile(rf"# HELP ({_NAME}) .*")
_TYPE = re.compile(rf"# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)")


def parse_exposition(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``text``; AssertionError naming the first line that is not valid text format."""
    assert text.endswith("\n"), "the last line must end with a newline"
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if m := _HELP.fullmatch(line):
            continue
        if m := _TYPE.fullmatch(line):
            assert m.group(1) not in types, f"line {number}: second TYPE for {m.group(1)}"
            types[m.group(1)] = m.group(2)
            continue
        m = _SAMPLE.fullmatch(line)
        assert m is not None, f"line {number} is not a valid sample: {line!r}"
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
        assert family in types, f"line {number}: sample of {name} before its TYPE line"
        pairs = frozenset(tuple(p.split("=", 1)) for p in re.findall(_LABEL, labels))
        key = (name, frozenset((k, v.strip('"')) for k, v in pairs))
        assert key not in samples, f"line {number}: series repeated"
        samples[key] = math.inf if value == "+Inf" else float(value)
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    want = frozenset(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_metrics_render_is_valid_exposition_format() -> None:
    m = Metrics('odd"name\\', "run")
    m.feed(("worker", "sweeper", "promoter"))
    for seconds in (0.05, 0.7, 7200.0):
        m.job_finished("acked", seconds)
    m.job_finished("buried", None)
    m.job_failed_to_start()
    m.recovered(promoted=4, reaped=2)
    samples = parse_exposition(m.render())
    base = {"queue": 'odd\\"name\\\\', "role": "run"}
    assert value(samples, "steadqd_jobs_total", state="acked", **base) == 3
    assert value(samples, "steadqd_jobs_total", state="buried", **base) == 1
    assert value(samples, "steadqd_jobs_total", state="retried", **base) == 0
    assert value(samples, "steadqd_jobs_total", state="failed_to_start", **base) == 1
    assert value(samples, "steadqd_promotions_total", **base) == 4
    assert value(samples, "steadqd_reaps_total", **base) == 2
    buckets = [value(samples, "steadqd_job_duration_seconds_bucket", le=f"{b:g}", **base) for b in DURATION_BUCKETS]
    assert buckets == sorted(buckets) and buckets[0] == 1 and buckets[-1] == 2  # 7200 s is above the last bound
    assert value(samples, "steadqd_job_duration_seconds_bucket", le="+Inf", **base) == 3
    assert value(samples, "steadqd_job_duration_seconds_count", **base) == 3
    assert value(samples, "steadqd_job_duration_seconds_sum", **base) == pytest.approx(7200.75)


def test_the_sweeper_file_has_the_queue_gauges_once_counted() -> None:
    """Issue 34 #3: what the alert rules watch (ready backlog, oldest ready job, dead letters, sweeper
    alive); a gauge not measured yet is absent, never a 0 that would read as an empty queue."""
    m = Metrics("q", "sweeper")
    m.feed(("sweeper",))
    names = {name for name, _ in parse_exposition(m.render())}
    assert names == {"steadqd_promotions_total", "steadqd_reaps_total"}
    m.counted({"ready": (3, 40.0), "delayed": (1, 2.0), "running": (0, 0.0), "dead": (2, 86400.0)})
    m.swept(1796130000.25)
    samples = parse_exposition(m.render())
    base = {"queue": "q", "role": "sweeper"}
    assert value(samples, "steadqd_queue_jobs", state="ready", **base) == 3
    assert value(samples, "steadqd_queue_jobs", state="dead", **base) == 2
    assert value(samples, "steadqd_queue_oldest_job_seconds", state="ready", **base) == 40
    assert value(samples, "steadqd_queue_oldest_job_seconds", state="running", **base) == 0
    assert value(samples, "steadqd_sweeper_last_pass_timestamp_seconds", **base) == 1796130000.25


def test_a_promoter_file_has_only_the_promoter_families() -> None:
    m = Metrics("q", "promoter")
    m.feed(("promoter",))
    names = {name for name, _ in parse_exposition(m.render())}
    assert names == {"steadqd_promotions_total"}


def test_steadqd_run_writes_the_textfile(tmp_path: Path, make_queue, queue_path: str) -> None:
    q = make_queue(delayed_width_ns=10**9)
    earlier = q.enqueue(b"x", max_attempts=1)  # a dead letter from before the start: the sweeper's count sees it
    lease = q.lease()
    assert lease is not None and lease.job_id == earlier
    q.bury(lease, reason=1)
    q.close()
    env = Env(tmp_path, queue_path)
    prom_dir = tmp_path / "textfiles"
    prom_dir.mkdir()
    configured = str(prom_dir / "steadq-testq.prom")
    doc = {
        "queue": queue_path,
        "metrics_textfile": configured,
        "worker": {
            "command": env.command(),
            "lease": "10s",
            "exit_status": {"retry": [75], "bury": [100]},
            "retry": {"backoff_base": "1s", "backoff_max": "1s", "jitter": False},
        },
    }
    (env.config_dir / "testq.yaml").write_text(yaml.safe_dump(doc))
    d = Daemon(env, "run")
    try:
        d.ready()
        with Queue.open(queue_path) as q:
            ok = q.enqueue(job_spec(exit=0))
            flaky = q.enqueue(job_spec(exit={"1": 75, "default": 0}))
            rejected = q.enqueue(job_spec(exit=100))
            later = q.enqueue(job_spec(exit=0), delay=0.5)
        for job, attempt in ((ok, 1), (flaky, 2), (rejected, 1), (later, 1)):
            env.result(job, attempt)
        path = Path(textfile_for(configured, "run"))

        def counted() -> dict | None:
            if not path.exists():
                return None
            samples = parse_exposition(path.read_text())
            acked = value(samples, "steadqd_jobs_total", queue="testq", role="run", state="acked")
            return samples if acked == 3 else None

        samples = wait_for(counted, 30, f"{path} to count 3 acked jobs")
    finally:
        d.stop()
    labels = {"queue": "testq", "role": "run"}
    assert value(samples, "steadqd_jobs_total", state="retried", **labels) == 1
    assert value(samples, "steadqd_jobs_total", state="buried", **labels) == 1
    assert value(samples, "steadqd_jobs_total", state="failed_to_start", **labels) == 0
    assert value(samples, "steadqd_promotions_total", **labels) == 2  # the delayed job and the retry
    assert value(samples, "steadqd_reaps_total", **labels) == 0
    assert value(samples, "steadqd_job_duration_seconds_count", **labels) == 5
    assert value(samples, "steadqd_queue_jobs", state="dead", **labels) >= 1  # counted at the first pass at least
    for state in ("ready", "delayed", "running"):  # every state has its series (value() fails on a missing one)
        assert value(samples, "steadqd_queue_jobs", state=state, **labels) >= 0
    assert value(samples, "steadqd_queue_oldest_job_seconds", state="dead", **labels) >= 0
    assert value(samples, "steadqd_sweeper_last_pass_timestamp_seconds", **labels) > 1.7e9
    # Atomic replacement leaves nothing else behind, and the file is readable by node-exporter.
    assert sorted(p.name for p in prom_dir.iterdir()) == ["steadq-testq.run.prom"]
    assert path.stat().st_mode & stat.S_IROTH


@pytest.mark.parametrize("bad", ["relative/q.prom", "/var/lib/steadq/metrics/q.txt", "/var/lib/steadq/metrics/"])
def test_check_config_refuses_a_textfile_node_exporter_would_not_read(tmp_path: Path, bad: str) -> None:
    (tmp_path / "q.yaml").write_text(f"queue: /var/lib/steadq/q\nmetrics_textfile: {bad}\n")
    r = subprocess.run([STEADQD, "--config-dir", str(tmp_path), "check-config"], capture_output=True, text=True)
    assert r.returncode == 78, (r.stdout, r.stderr)
    assert "metrics_textfile" in r.stderr and ".prom" in r.stderr and "q.yaml:2" in r.stderr, r.stderr


# -- the metrics directory against a member of the queue's group (issue 30 A) -----------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


def _victim(tmp_path: Path) -> Path:
    """A root-only file the member would like overwritten."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    victim = private / "shadow"
    victim.write_text("root's data\n")
    return victim


def _plant_links(directory: Path, final: str, victim: Path) -> None:
    """As the member: a symlink at the final name and at every temp name it can predict (pids are public)."""

    def plant() -> None:
        os.symlink(victim, directory / final)
        for pid in range(max(2, os.getpid() - 200), os.getpid() + 200):
            os.symlink(victim, directory / f".{final}.{pid}.tmp")

    assert as_user(PRODUCER, plant) == "ok"


@needs_root
def test_a_group_writable_metrics_directory_is_refused_and_nothing_is_followed(tmp_path: Path) -> None:
    traversable(tmp_path)
    victim = _victim(tmp_path)
    directory = tmp_path / "metrics"
    directory.mkdir()
    os.chown(directory, 0, QUEUE_GID)
    os.chmod(directory, 0o2770)  # the attack case: the queue's group may write the directory
    _plant_links(directory, "q.worker.prom", victim)
    with pytest.raises(UncontrolledDirectory) as caught:
        write_textfile(str(directory / "q.worker.prom"), "steadqd_jobs_total 1\n")
    message = str(caught.value)
    assert str(directory) in message and "chmod" in message and "\n" not in message, message
    assert victim.read_text() == "root's data\n"
    assert (directory / "q.worker.prom").is_symlink()  # left as planted: never written through


@needs_root
def test_a_sticky_metrics_directory_is_written_without_following_a_planted_link(tmp_path: Path) -> None:
    traversable(tmp_path)
    victim = _victim(tmp_path)
    directory = tmp_path / "metrics"
    directory.mkdir()
    os.chown(directory, 0, QUEUE_GID)
    os.chmod(directory, 0o1777)  # like /tmp: anyone creates, nobody replaces another's entry
    _plant_links(directory, "q.worker.prom", victim)
    write_textfile(str(directory / "q.worker.prom"), "steadqd_jobs_total 1\n")
    assert victim.read_text() == "root's data\n"
    final = directory / "q.worker.prom"
    info = final.lstat()
    assert stat.S_ISREG(info.st_mode) and info.st_uid == 0 and info.st_mode & stat.S_IROTH
    assert final.read_text() == "steadqd_jobs_total 1\n"


@needs_root
def test_a_metrics_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir(mode=0o755)
    os.chown(directory, PRODUCER[0], PRODUCER[1])  # its owner could swap anything in it
    with pytest.raises(UncontrolledDirectory, match="chown"):
        write_textfile(str(directory / "q.worker.prom"), "x 1\n")
    assert list(directory.iterdir()) == []


def test_a_symlinked_metrics_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError):
        write_textfile(str(tmp_path / "link" / "q.worker.prom"), "x 1\n")
    assert list(real.iterdir()) == []


def test_job_progress_is_a_gauge_per_slot_and_goes_with_the_job() -> None:
    """Issue 32 #4: one series per slot (bounded by concurrency, not by job ids), removed when its job ends."""
    from steadqd.daemon import metrics

    m = Metrics("q", "worker")
    m.feed(("worker",))
    m.job_progress(1, 42.5)
    m.job_progress(0, 7.0)
    samples = parse_exposition(m.render())
    assert value(samples, "steadqd_job_progress_percent", queue="q", role="worker", slot="1") == 42.5
    assert value(samples, "steadqd_job_progress_percent", queue="q", role="worker", slot="0") == 7
    m.job_progress(1, None)
    names = [ls for name, ls in parse_exposition(m.render()) if name == "steadqd_job_progress_percent"]
    assert len(names) == 1
    assert "job_progress" in metrics.__all__


def test_a_watch_folder_that_is_not_watched_is_a_gauge_of_1_until_a_reload_watches_it(
    tmp_path: Path, make_queue, queue_path: str
) -> None:
    """steadqd_inbox_failed (issue 33 #2): the jobs go on running, so an alert needs a metric, not an exit."""
    make_queue().close()
    env = Env(tmp_path, queue_path)
    prom_dir = tmp_path / "textfiles"
    prom_dir.mkdir()
    configured = str(prom_dir / "steadq-testq.prom")
    folder = tmp_path / "drop"  # not there yet: the folder fails, the worker starts all the same
    doc = {
        "queue": queue_path,
        "metrics_textfile": configured,
        "worker": {"command": env.command(), "lease": "10s"},
        "inbox": {"path": str(folder), "settle": "0.3s", "after": "delete", "payload": "content"},
    }
    (env.config_dir / "testq.yaml").write_text(yaml.safe_dump(doc))
    path = Path(textfile_for(configured, "worker"))

    def gauge(expected: float) -> Callable[[], bool]:
        def check() -> bool:
            if not path.exists():
                return False
            samples = parse_exposition(path.read_text())
            return value(samples, "steadqd_inbox_failed", queue="testq", role="worker") == expected

        return check

    d = Daemon(env, "worker")
    try:
        d.ready()
        wait_for(gauge(1), 30, f"{path} to say steadqd_inbox_failed 1")
        folder.mkdir()
        d.signal(signal.SIGHUP)
        d.wait_log(r"reloaded configuration$")
        wait_for(gauge(0), 30, f"{path} to say steadqd_inbox_failed 0")
    finally:
        d.stop()


def test_the_inbox_gauge_is_in_the_files_of_processes_that_watch_a_folder_only() -> None:
    m = Metrics("q", "worker")
    m.feed(("worker",))
    assert "steadqd_inbox_failed" not in {name for name, _ in parse_exposition(m.render())}
    m.feed(("inbox",))
    m.inbox_failed(True)
    assert value(parse_exposition(m.render()), "steadqd_inbox_failed", queue="q", role="worker") == 1


def test_the_sweeper_counts_at_most_every_count_interval_and_only_with_a_file(
    tmp_path: Path, make_queue, queue_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count lists every state: a sweeper with a short interval must not list a big tree at each pass."""
    q = make_queue()
    q.enqueue(b"a")
    (tmp_path / "q.yaml").write_text(f"queue: {queue_path}\nmetrics_textfile: {tmp_path}/q.prom\n")
    m = Metrics("q", "sweeper")
    m.feed(("sweeper",))
    monkeypatch.setattr(metrics, "_process", m)
    role = SweeperRole(load_config("q", str(tmp_path)), Log("sweeper", "q", journal=False, stream=io.StringIO()))
    role._count(q)
    assert value(parse_exposition(m.render()), "steadqd_queue_jobs", state="ready") == 1
    q.enqueue(b"b")
    role._count(q)  # within COUNT_INTERVAL of the first: not counted again
    assert value(parse_exposition(m.render()), "steadqd_queue_jobs", state="ready") == 1
    monkeypatch.setattr(metrics, "COUNT_INTERVAL", 0.0)
    role._count(q)
    assert value(parse_exposition(m.render()), "steadqd_queue_jobs", state="ready") == 2
    (tmp_path / "r.yaml").write_text(f"queue: {queue_path}\n")  # no metrics file: no count at all
    fresh = Metrics("r", "sweeper")
    fresh.feed(("sweeper",))
    monkeypatch.setattr(metrics, "_process", fresh)
    SweeperRole(load_config("r", str(tmp_path)), Log("sweeper", "r", journal=False, stream=io.StringIO()))._count(q)
    assert "steadqd_queue_jobs" not in fresh.render()


def _metrics_preflight(textfile: Path) -> list[str]:
    """What a start's preflight says about ``metrics_textfile: <textfile>``, as the service user it runs as."""
    settings = QueueSettings(name="q", source="/etc/steadq/queues/q.yaml", queue="/srv/q", worker=None,
                             metrics_textfile=str(textfile))  # fmt: skip
    return [p.text for p in metrics_problems(settings, Account.current())]


def test_the_preflight_says_what_is_wrong_with_the_metrics_directory_before_a_start(tmp_path: Path) -> None:
    """Each way the directory can fail the writer's rule is one line naming it and what to do (nothing is made)."""
    user = Account.current().name
    missing = tmp_path / "gone"
    assert _metrics_preflight(missing / "q.prom") == [
        f"metrics_textfile: directory {missing} does not exist, so {missing}/q.worker.prom cannot be written; "
        f"install -d -o {user} -m 0755 {missing}"
    ]
    assert not missing.exists()
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(real)
    assert _metrics_preflight(tmp_path / "link" / "q.prom") == [
        f"metrics_textfile: directory {tmp_path / 'link'} is a symbolic link, which the writer never follows; "
        f"name the real directory ({real}) in metrics_textfile:"
    ]
    (tmp_path / "file").write_text("")
    assert _metrics_preflight(tmp_path / "file" / "q.prom") == [
        f"metrics_textfile: {tmp_path / 'file'} is not a directory; install -d -o {user} -m 0755 {tmp_path / 'file'}"
    ]
    assert _metrics_preflight(real / "q.prom") == []
