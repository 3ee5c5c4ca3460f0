"""A configuration naming something that is not a queue is refused before anything is touched.

The config is trusted (root writes /etc/steadq), but a typo must not turn
the daemon loose on the wrong directory: ``steadqd check-config --open`` and
the worker's start both refuse a queue path that is not an initialised queue,
with a clear error, without creating, reading or changing anything there.
YAML safety (safe loader, no tags, no anchors/aliases, size cap) is covered
in tests/unit/test_config.py (test_alias_bomb_refused_quickly,
test_oversized_file_refused, the "custom tag" and "alias" rules).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from steadqd import Queue, SteadQError
from steadqd.daemon.config import parse_config
from steadqd.daemon.journal import Log
from steadqd.daemon.main import daemon_main
from steadqd.daemon.worker.role import WorkerRole
from tests.security.test_hostile_tree import Frozen


def _empty_dir(tmp: Path) -> tuple[str, Path | None]:
    d = tmp / "empty"
    d.mkdir()
    (d / "bystander").write_bytes(b"not a job")
    return str(d), d


def _regular_file(tmp: Path) -> tuple[str, Path | None]:
    f = tmp / "file"
    f.write_bytes(b"just a file")
    return str(f), tmp


def _missing(tmp: Path) -> tuple[str, Path | None]:
    return str(tmp / "missing" / "queue"), tmp


def _symlink_to_queue(tmp: Path) -> tuple[str, Path | None]:
    real = tmp / "real"
    Queue.init(str(real), shards=1).close()
    (tmp / "link").symlink_to(real)
    return str(tmp / "link"), real


def _inside_a_queue(tmp: Path) -> tuple[str, Path | None]:
    real = tmp / "real"
    Queue.init(str(real), shards=1).close()
    return str(real / "ready"), real


def _half_initialised(tmp: Path) -> tuple[str, Path | None]:
    d = tmp / "half"
    d.mkdir()
    (d / ".initializing").write_bytes(b"")
    return str(d), d


CASES: dict[str, tuple[Callable[[Path], tuple[str, Path | None]], str]] = {
    "empty directory": (_empty_dir, "is not a queue"),
    "regular file": (_regular_file, "not a directory"),
    "missing path": (_missing, "does not exist"),
    "symlink to a queue": (_symlink_to_queue, "is a symlink"),
    "state directory of a queue": (_inside_a_queue, "is not a queue"),
    "interrupted init": (_half_initialised, "initialization was interrupted"),
}


def _write(cfg_dir: Path, name: str, queue: str) -> None:
    cfg_dir.mkdir(exist_ok=True)
    (cfg_dir / f"{name}.yaml").write_text(f"queue: {queue}\nworker:\n  command: [/bin/true]\n")


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_config_open_refuses_what_is_not_a_queue(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make, message = CASES[case]
    (tmp_path / "w").mkdir()
    queue, watch = make(tmp_path / "w")
    frozen = Frozen(watch) if watch is not None else None
    if frozen is not None:
        frozen.freeze()
    cfg = tmp_path / "cfg"
    _write(cfg, "q", queue)
    assert daemon_main(["--config-dir", str(cfg), "check-config", "q"]) == 0  # syntax alone is fine
    capsys.readouterr()
    assert daemon_main(["--config-dir", str(cfg), "check-config", "--open", "q"]) == 78
    err = capsys.readouterr().err
    assert err.startswith("q: ") and message in err, err
    if frozen is not None:
        frozen.assert_untouched()
    if case == "missing path":
        assert not os.path.lexists(os.path.dirname(queue))  # nothing was created on the way


@pytest.mark.parametrize("case", sorted(CASES))
def test_worker_start_refuses_what_is_not_a_queue(tmp_path: Path, case: str) -> None:
    """The role's start (what `steadqd worker` runs after READY checks) raises before touching anything."""
    make, message = CASES[case]
    (tmp_path / "w").mkdir()
    queue, watch = make(tmp_path / "w")
    frozen = Frozen(watch) if watch is not None else None
    if frozen is not None:
        frozen.freeze()
    settings = parse_config(f"queue: {queue}\nworker:\n  command: [/bin/true]\n", path="q.yaml", name="q")
    role = WorkerRole(settings, Log("worker", "q", journal=False))
    with pytest.raises(SteadQError, match=message):
        role.start(object())  # type: ignore[arg-type] - never reaches the loop
    assert role.q is None
    if frozen is not None:
        frozen.assert_untouched()
    if case == "missing path":
        assert not os.path.lexists(os.path.dirname(queue))


@pytest.mark.parametrize("path", ["/", "/etc", "/etc/", "/var/lib", "/tmp", "/usr/../etc"])
def test_system_directories_are_refused_by_check_config(
    tmp_path: Path, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused at validation (tests/unit/test_config.py has the per-rule errors); here end to end."""
    _write(tmp_path, "sys", path)
    assert daemon_main(["--config-dir", str(tmp_path), "check-config", "sys"]) == 78
    assert "refusing" in capsys.readouterr().err


def test_a_config_passing_the_daemon_s_secret_key_to_jobs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pass_environment: [AWS_SECRET_ACCESS_KEY]` would hand the store's secret to every job (issue 30 C)."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "daemon-secret")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "q.yaml").write_text(
        f"queue: {tmp_path / 'q'}\nworker:\n  command: [/usr/bin/env]\n  pass_environment: [PATH, AWS_SECRET_ACCESS_KEY]\n"
    )
    assert daemon_main(["--config-dir", str(cfg), "check-config", "q"]) == 78
    err = capsys.readouterr().err
    assert "worker.pass_environment[1]" in err and "AWS_SECRET_ACCESS_KEY" in err, err
    assert "daemon-secret" not in err
