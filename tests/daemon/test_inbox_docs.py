"""The transcoding drop folder of docs/watch-folders.md runs as written.

The shell block is taken from the page, its /var/tmp/tc moved under the
test's tmp_path, and run; then the daemon it ends with is started and a file
is dropped in. A stand-in ``ffmpeg`` first on PATH (it copies its input to its
output) makes the job take the same branch on every machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.daemon.conftest import DEADLINE, wait_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "watch-folders.md"
EXAMPLE_ROOT = "/var/tmp/tc"
FAKE_FFMPEG = '#!/bin/sh\nfor last; do :; done\nwhile [ "$1" != -i ]; do shift; done\ncp "$2" "$last"\n'


def example_block() -> str:
    doc = DOC.read_text()
    section = doc[doc.index("## Example: a transcoding drop folder") :]
    return re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)  # type: ignore[union-attr]


def test_the_transcoding_drop_folder_example_runs(tmp_path: Path) -> None:
    root = tmp_path / "tc"
    setup, _, last = example_block().replace(EXAMPLE_ROOT, str(root)).rstrip("\n").rpartition("\n")
    assert last.startswith("steadqd --config-dir") and last.endswith(" run transcode"), last
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "ffmpeg").write_text(FAKE_FFMPEG)
    (tools / "ffmpeg").chmod(0o755)
    env = {"PATH": f"{tools}:{os.path.dirname(sys.executable)}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    subprocess.run(["sh", "-euc", setup], env=env, check=True, timeout=DEADLINE, capture_output=True)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(["sh", "-c", f"exec {last}"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"started" in log.read_bytes(), what="the daemon to start")
        (tmp_path / "holiday.mkv").write_bytes(b"frames")
        os.rename(tmp_path / "holiday.mkv", root / "inbox" / "holiday.mkv")
        result = root / "out" / "holiday.mp4"
        wait_for(lambda: b" finished: ack (" in log.read_bytes(), what="the job to finish")
        assert result.read_bytes() == b"frames"
        assert (root / "taken" / "holiday.mkv").exists() and not (root / "inbox" / "holiday.mkv").exists()
        text = log.read_text()
        assert re.search(r"watch folder: holiday\.mkv enqueued as job [0-9a-f]{32}", text), text
        assert f"transcoded {root}/taken/holiday.mkv to {root}/out/holiday.mp4" in text
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
