"""The job command of ``steadqd demo``: ``python -m steadqd.demo.job``.

It is an ordinary job command, written the way any job command for
``steadqd worker`` is written, so it doubles as an example:

* the payload arrives on standard input (``worker.input: stdin``; it is a
  read-only regular file, so reading it whole is fine);
* the job's facts arrive in environment variables (``STEADQ_JOB_ID``,
  ``STEADQ_ATTEMPT``, ``STEADQ_MAX_ATTEMPTS``, ``STEADQ_META_<KEY>`` ...);
* every line written to stdout or stderr is forwarded by the worker to the
  journal (or to the daemon's stderr) with the job's fields;
* the exit status decides what happens to the job: 0 acknowledges it,
  75 (EX_TEMPFAIL) asks for a retry with backoff, 100 buries it (the demo's
  configuration maps exactly these; see ``steadqd/demo/queue_setup.py``).

The payload is a small JSON object ``{"frame": N, "kind": K}``. ``plain``
jobs succeed, ``flaky`` jobs fail with 75 on their first attempt only (so the
retry path is shown and then succeeds), ``poison`` jobs always exit 100.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

EXIT_ACK = 0
EXIT_RETRY = 75  # EX_TEMPFAIL from sysexits.h: "try again later"
EXIT_BURY = 100
EXIT_BAD_INPUT = 65  # EX_DATAERR: not a demo payload (the demo config retries it: "other")


def run(payload: bytes, env: dict[str, str] | os._Environ[str]) -> int:
    """Do the "work" for one job and return the exit status that settles it."""
    job_id = env.get("STEADQ_JOB_ID", "?")[:12]
    attempt = int(env.get("STEADQ_ATTEMPT", "1") or 1)
    max_attempts = env.get("STEADQ_MAX_ATTEMPTS", "?")
    try:
        job = json.loads(payload)
        frame, kind = int(job["frame"]), str(job["kind"])
    except (ValueError, KeyError, TypeError) as e:
        print(f"demo-job {job_id}: not a demo payload: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # A few milliseconds of real work: hash the payload.
    digest = payload
    for _ in range(2000):
        digest = hashlib.sha256(digest).digest()
    time.sleep(0.005 + (frame % 7) * 0.002)
    if kind == "poison":
        print(
            f"demo-job {job_id}: frame {frame} is poison (attempt {attempt}/{max_attempts}); giving up", file=sys.stderr
        )
        return EXIT_BURY
    if kind == "flaky" and attempt == 1:
        print(
            f"demo-job {job_id}: frame {frame}: temporary failure on attempt {attempt}/{max_attempts}; asking for a retry",
            file=sys.stderr,
        )
        return EXIT_RETRY
    print(f"demo-job {job_id}: frame {frame} ({kind}) rendered on attempt {attempt}: {digest.hex()[:16]}")
    return EXIT_ACK


def main() -> int:
    return run(sys.stdin.buffer.read(), os.environ)


if __name__ == "__main__":
    sys.exit(main())
