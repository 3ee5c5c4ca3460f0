"""``steadq doctor``: can this machine and filesystem hold a queue? Exit 6 if any check fails.

The spec's checks (cli.md), then ``job_spawn`` and ``claim_path``: which spawn path the worker uses and
which claim path a lease takes, the C claim core or pure Python (issue 35).
"""

from __future__ import annotations

import argparse

from steadqd.backend import claim_path, doctor
from steadqd.cli.common import Subcommands, add_queue_command, err, error_text, out_json


def add_doctor(sub: Subcommands) -> None:
    add_queue_command(
        sub, "doctor", "check the machine and filesystem", "steadq doctor /srv/q", run=cmd_doctor, existing=False
    )


def cmd_doctor(a: argparse.Namespace) -> int:
    from steadqd.daemon.worker.run import fastspawn  # loads the compiled spawn: only for doctor

    checks = [(name, ok, value if isinstance(value, str) else error_text(value)) for name, ok, value in doctor(a.path)]
    # Not a check of PATH: which job spawn this installation's worker uses (the fallback works, at more CPU a job).
    checks.append(("job_spawn", True, fastspawn.path()))
    checks.append(("claim_path", True, claim_path()))
    if a.json:
        out_json({name: {"ok": ok, "value": value} for name, ok, value in sorted(checks)})
    else:
        err(f"steadq doctor {a.path}", *(f"  {n}: {v}{'' if ok else ' [FAIL]'}" for n, ok, v in checks))
    return 0 if all(ok for _, ok, _ in checks) else 6


COMMANDS = {"doctor": add_doctor}
