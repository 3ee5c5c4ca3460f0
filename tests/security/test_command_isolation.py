"""Job data reaches the command only as data, and `shell: false` never runs a shell.

What is already covered elsewhere (docs/security.md points there):
tests/daemon/test_spawner.py::test_build_environment_is_config_only (the
environment is built from the config, nothing else inherited) and
::test_environment_metadata_and_payload_file_are_data (``$()``, backticks,
quotes and newlines in metadata arrive verbatim in STEADQ_META_*).

Added here, against a real ``steadqd worker`` process: a command whose
*path* and argv items are full of shell metacharacters runs exactly as
written (a shell would split, expand or execute them), the child's parent
is the daemon itself, a NUL in a metadata value (legal CBOR text, accepted
at enqueue) is dropped from the environment instead of truncating or
failing the job, and payload bytes (NUL, quotes, ``$()``) arrive on stdin
byte for byte.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from steadqd import Queue
from tests.daemon.conftest import Env, daemons, denv, wait_for  # noqa: F401 - fixtures used by name
from tests.invariants import live_tree

SCRIPT = r"""#!{python}
import json, os, sys
out = os.environ["RESULTS"]
info = {{
    "argv": sys.argv,
    "ppid": os.getppid(),
    "cmdline": open("/proc/self/cmdline", "rb").read().decode("latin-1"),
    "parent_cmdline": open(f"/proc/{{os.getppid()}}/cmdline", "rb").read().decode("latin-1"),
    "env": dict(os.environ),
    "stdin": sys.stdin.buffer.read().decode("latin-1"),
}}
tmp = os.path.join(out, os.environ["STEADQ_JOB_ID"] + ".tmp")
with open(tmp, "w") as f:
    json.dump(info, f)
os.rename(tmp, tmp[:-4] + ".json")
"""


def test_metacharacters_in_command_and_job_data_are_inert(denv: Env, daemons, tmp_path: Path) -> None:  # noqa: F811
    pwned = tmp_path / "pwned"
    cwd = tmp_path / "cwd"  # where a relative `touch pwned` of an accidental shell would land
    cwd.mkdir()
    weird_dir = tmp_path / "dir with spaces;$(touch pwned);`touch pwned`"
    weird_dir.mkdir()
    script = weird_dir / "job 'single' \"double\" |pipe &amp *glob? >redir.py"
    script.write_text(SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    argv = [str(script), f"$(touch {pwned})", "a;b", "*", f"`touch {pwned}`", "", "two words", "new\nline", "'\""]
    denv.write_config(command=argv, environment={"RESULTS": str(denv.results)}, pass_environment=["PATH"],
                      working_directory=str(cwd))  # fmt: skip
    meta = {
        "nul": "before\0after",
        "subst": f"$(touch {pwned})",
        "quotes": 'it\'s "q" \\',
        "lines": "one\ntwo\r\nthree",
    }
    payload = b"\0binary\0 $(touch " + str(pwned).encode() + b") 'x' \"y\"\n"
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(payload, metadata=meta)
        d.ready()
        result = denv.results / f"{job}.json"
        wait_for(result.exists, what="the job's record")
        wait_for(lambda: job in live_tree(denv.queue_path).receipts, what="ack")  # the daemon is still settling
    info = json.loads(result.read_text())
    assert info["argv"] == argv  # exactly the configured items: nothing split, globbed or expanded
    assert info["cmdline"].split("\0")[1:-1] == argv  # the interpreter's argv: no sh -c in between
    assert info["ppid"] == d.pid  # exec'd by the daemon itself, not by an intermediate shell
    assert "steadqd" in info["parent_cmdline"]
    env = info["env"]
    assert env["STEADQ_META_SUBST"] == meta["subst"]
    assert env["STEADQ_META_QUOTES"] == meta["quotes"]
    assert env["STEADQ_META_LINES"] == meta["lines"]
    assert "STEADQ_META_NUL" not in env  # cannot be an environment string: left out, the job still runs
    assert info["stdin"].encode("latin-1") == payload
    assert not pwned.exists() and os.listdir(cwd) == []
    assert set(os.listdir(weird_dir)) == {script.name}
