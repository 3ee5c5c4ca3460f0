"""``steadq bench``: producer and consumer processes against an existing queue, for a rough rate.

Processes, not threads: that is how Python users scale consumers, and threads
would share one GIL, so the numbers would measure the interpreter lock rather
than the queue (and lose first when other work shares the CPU). The flags and
the four output lines are the reference implementation's, so the two can be
run with the same command line and compared (``benchmarks/bench_cli.py``).
Any filesystem is accepted (the numbers are the point, not crash safety);
``benchmarks/`` has the careful measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Literal

from steadqd.cli.common import (
    CliError,
    Subcommands,
    add_queue_command,
    duration,
    err,
    error_text,
    int_in,
    open_queue,
)

Role = Literal["producer", "consumer"]
COUNTERS = ("enqueued", "leased", "acked")


def add_bench(sub: Subcommands) -> None:
    s = add_queue_command(
        sub,
        "bench",
        "throughput test on an existing queue",
        "steadq bench /srv/q --producers 2 --consumers 2",
        run=cmd_bench,
    )
    s.add_argument("--producers", type=int_in(0, 4096, "count"), default=1, help="producer processes")
    s.add_argument("--consumers", type=int_in(0, 4096, "count"), default=1, help="consumer processes")
    s.add_argument(
        "--duration",
        "--duration-seconds",
        dest="duration_seconds",
        type=duration,
        default=10.0,
        metavar="DURATION",
        help="how long to run: 10s, 1m, or seconds",
    )
    s.add_argument(
        "--payload-size", type=int_in(0, 1 << 30, "size"), default=1024, metavar="BYTES", help="bytes per job"
    )
    s.add_argument(
        "--lease-duration",
        "--lease-duration-seconds",
        dest="lease_duration_seconds",
        type=duration,
        default=30.0,
        metavar="DURATION",
        help="each consumer's lease: 30s, or seconds",
    )


@dataclass(frozen=True)
class Plan:
    path: str
    payload_size: int
    lease_duration: float


def _work(role: Role, plan: Plan, conn: Connection) -> None:
    """One worker process: open, say ready, wait for the common deadline, run, report its counts.

    The handle is opened before the clock starts so that process start-up and
    queue opening are not charged to the measured window.
    """
    counts = dict.fromkeys(COUNTERS, 0)
    error = ""
    try:
        with contextlib.closing(open_queue(plan.path, allow_unsupported_fs=True)) as q:
            conn.send(("ready", ""))
            deadline: float = conn.recv()
            if role == "producer":
                payload = b"\x42" * plan.payload_size
                while time.monotonic() < deadline:
                    q.enqueue(payload, content_type="bench", max_attempts=3)
                    counts["enqueued"] += 1
            else:
                while time.monotonic() < deadline:
                    lease = q.lease(wait=0.0, duration=plan.lease_duration)
                    if lease is None:
                        time.sleep(0.001)
                        continue
                    counts["leased"] += 1
                    q.ack(lease)
                    counts["acked"] += 1
    except KeyboardInterrupt:
        return  # the parent saw the same Ctrl-C; a job leased and not acked comes back at its lease's end
    except CliError as e:
        error = "; ".join(e.lines)
    except Exception as e:  # noqa: BLE001 - reported by the parent as one line, never a traceback
        error = f"{role} {os.getpid()}: {error_text(e)}"
    with contextlib.suppress(OSError):
        conn.send(("done", (counts, error)))


def _collect(conn: Connection) -> tuple[dict[str, int], str]:
    """The counts a worker reports at its end; a worker that died silently is an error, not zeros."""
    try:
        _, body = conn.recv()
    except EOFError:
        return dict.fromkeys(COUNTERS, 0), "a worker process exited without reporting"
    counts, error = body
    return counts, error


def run_bench(plan: Plan, producers: int, consumers: int, duration: float) -> tuple[dict[str, int], list[str]]:
    """Start every worker, release them together for ``duration`` seconds, and add up their counts.

    fork, not spawn: a spawned child re-imports the CLI for ~100 ms of CPU
    each, which on a small machine would still be running when the clock starts.
    """
    ctx = multiprocessing.get_context("fork")
    producer: Role = "producer"
    consumer: Role = "consumer"
    roles = [producer] * producers + [consumer] * consumers
    workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    try:
        for role in roles:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_work, args=(role, plan, theirs), daemon=True)
            p.start()
            theirs.close()
            workers.append((p, mine))
        ready: list[Connection] = []
        totals = dict.fromkeys(COUNTERS, 0)
        errors: list[str] = []
        for _, conn in workers:
            try:
                kind, body = conn.recv()
            except EOFError:
                errors.append("a worker process exited before it was ready")
                continue
            if kind == "ready":
                ready.append(conn)
            else:
                errors.append(body[1])
        deadline = time.monotonic() + duration
        for conn in ready:
            conn.send(deadline)
        for conn in ready:
            counts, error = _collect(conn)
            for k in COUNTERS:
                totals[k] += counts[k]
            if error:
                errors.append(error)
        return totals, errors
    finally:
        for proc, conn in workers:
            conn.close()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def cmd_bench(a: argparse.Namespace) -> int:
    open_queue(a.path, allow_unsupported_fs=True).close()  # a bad path is one line here, not one per worker
    plan = Plan(a.path, a.payload_size, a.lease_duration_seconds)
    totals, errors = run_bench(plan, a.producers, a.consumers, a.duration_seconds)
    # Rates over the nominal duration, as the reference computes them, so the two
    # print comparable figures for the same command line.
    seconds = max(a.duration_seconds, 1e-9)
    err(
        f"bench: {a.producers} producers, {a.consumers} consumers, {a.duration_seconds:g}s, {a.payload_size}B payload",
        *(f"{k}: {v} ({v / seconds:.0f}/s)" for k, v in totals.items()),
        *(f"error: {e}" for e in errors),
    )
    return 6 if errors else 0


COMMANDS = {"bench": add_bench}
