"""``steadq bench``: producer and consumer threads against an existing queue, for a rough rate.

Any filesystem is accepted (the numbers are the point, not crash safety);
``benchmarks/`` has the careful measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time

from steadqd.cli.common import CliError, Subcommands, add_command, err, int_in, open_queue, seconds_number
from steadqd.errors import SteadQError


def add_bench(sub: Subcommands) -> None:
    s = add_command(
        sub, "bench", "throughput test on an existing queue", "steadq bench /srv/q --producers 2 --consumers 2"
    )
    s.add_argument("path", metavar="PATH")
    s.add_argument("--producers", type=int_in(0, 4096, "count"), default=1)
    s.add_argument("--consumers", type=int_in(0, 4096, "count"), default=1)
    s.add_argument("--duration-seconds", type=seconds_number, default=10.0, metavar="S")
    s.add_argument("--payload-size", type=int_in(0, 1 << 30, "size"), default=1024, metavar="BYTES")
    s.add_argument("--lease-duration-seconds", type=seconds_number, default=30.0, metavar="S")
    s.set_defaults(run=cmd_bench)


def cmd_bench(a: argparse.Namespace) -> int:
    open_queue(a.path, allow_unsupported_fs=True).close()
    lock = threading.Lock()
    counts = {"enqueued": 0, "leased": 0, "acked": 0}
    errors: list[str] = []
    stop_at = time.monotonic() + a.duration_seconds
    payload = b"\x42" * a.payload_size

    def bump(key: str) -> None:
        with lock:
            counts[key] += 1

    def producer() -> None:
        try:
            with contextlib.closing(open_queue(a.path, allow_unsupported_fs=True)) as q:
                while time.monotonic() < stop_at:
                    q.enqueue(payload, content_type="bench", max_attempts=3)
                    bump("enqueued")
        except (SteadQError, CliError) as e:
            errors.append(str(e))

    def consumer() -> None:
        try:
            with contextlib.closing(open_queue(a.path, allow_unsupported_fs=True)) as q:
                while time.monotonic() < stop_at:
                    lease = q.lease(wait=0.0, duration=a.lease_duration_seconds)
                    if lease is None:
                        time.sleep(0.001)
                        continue
                    bump("leased")
                    q.ack(lease)
                    bump("acked")
        except (SteadQError, CliError) as e:
            errors.append(str(e))

    start = time.monotonic()
    threads = [threading.Thread(target=producer, daemon=True) for _ in range(a.producers)]
    threads += [threading.Thread(target=consumer, daemon=True) for _ in range(a.consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = max(time.monotonic() - start, 1e-9)
    err(
        f"bench: {a.producers} producers, {a.consumers} consumers, {a.duration_seconds:g}s, {a.payload_size}-byte payloads",
        *(f"{k}: {v} ({v / elapsed:.0f}/s)" for k, v in counts.items()),
        *(f"error: {e}" for e in errors),
    )
    return 0


COMMANDS = {"bench": add_bench}
