"""``steadqd``'s command line (issue 17, point 4): ``--version``, and ``--config-dir`` before or
after the subcommand, through the installed console script as systemd and operators run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from steadqd import Queue

STEADQD = shutil.which("steadqd", path=os.path.dirname(sys.executable))


def steadqd(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    assert STEADQD is not None, "steadqd console script not installed: run .venv/bin/pip install -e ."
    return subprocess.run(
        [STEADQD, *map(str, args)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_version_names_the_job_spawn_path() -> None:
    from steadqd.daemon.worker.run import fastspawn
    from steadqd.fs.compiled import bridge

    d = steadqd("--version")
    want = f"steadqd {version('steadqd')}\njob spawn: {fastspawn.path()}\nclaim: {bridge.path()}\n"
    assert (d.returncode, d.stdout) == (0, want)


def test_config_dir_before_or_after_the_subcommand(
    tmp_path: Path, make_queue: Callable[..., Queue], queue_path: str
) -> None:
    make_queue().close()
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "q1.yaml").write_text(f"queue: {queue_path}\nworker:\n  command: [/bin/true]\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (
        ("--config-dir", conf, "check-config", "q1"),
        ("check-config", "q1", "--config-dir", conf),
        ("check-config", "--config-dir", conf, "q1"),
    ):
        d = steadqd(*argv)
        assert (d.returncode, d.stdout) == (0, f"q1: ok ({queue_path})\n"), (argv, d.stderr)
    # Given twice, the one after the subcommand wins, as the last of a flag does anywhere.
    d = steadqd("--config-dir", conf, "check-config", "q1", "--config-dir", empty)
    assert d.returncode == 78 and str(empty) in d.stderr, d.stderr


def _undocumented(help_text: str) -> list[str]:
    """Option and argument lines of argparse's --help that have no help text after them."""
    lines = help_text.splitlines()
    bare = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"  (\S.*?)(?:\s{2,}\S.*)?", line)
        if not m or line.startswith("   ") or m.group(1).endswith(":"):
            continue
        documented = re.fullmatch(r"  \S.*?\s{2,}\S.*", line) or (
            i + 1 < len(lines) and re.match(r"\s{20,}\S", lines[i + 1])
        )
        if not documented:
            bare.append(m.group(1))
    return bare


def test_every_option_and_argument_has_help_text() -> None:
    top = steadqd("--help").stdout
    commands = re.findall(r"^    ([a-z][a-z-]+)\s", top, re.M)
    assert "worker" in commands and "completion" in commands, top
    assert _undocumented(top) == []
    for name in commands:
        if name == "demo":
            continue  # its own parser, steadqd.demo
        d = steadqd(name, "--help")
        assert d.returncode == 0, d.stderr
        assert _undocumented(d.stdout) == [], (name, d.stdout)


def test_the_daemon_command_loads_the_demo_only_for_steadqd_demo() -> None:
    """Every daemon start imports steadqd.daemon.main; the demo (and its SeaweedFS launcher) waits for `demo`."""
    probe = "import sys, steadqd.daemon.main; print(sorted(m for m in sys.modules if m.startswith('steadqd.demo')))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.strip() == "[]", r.stdout
    d = steadqd("demo", "--help")
    assert d.returncode == 0 and d.stdout.startswith("usage: steadqd demo"), (d.stdout, d.stderr)
