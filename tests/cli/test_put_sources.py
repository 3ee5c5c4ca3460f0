"""``put --path``, ``put --lines`` and the refusal of an empty payload (issue 33 #7).

The reported defects: ``steadq put Q movie.mkv`` copies a 4 GB video into
the queue when the worker only needs to know where it is; there was no
one-job-per-line mode; ``put </dev/null`` (a script whose producer printed
nothing) silently enqueued an empty job.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.invariants import check_tree

from .helpers import steadq
from .test_put_interrupted import _check_run, _interrupted_put


def test_an_empty_stdin_is_refused_unless_allowed(qpath: str, tmp_path: Path) -> None:
    r = steadq("put", qpath, stdin=b"")
    assert r.code == 1, r
    assert r.err_lines == [
        "put: the payload is empty (stdin gave no bytes): nothing was enqueued; "
        "give --allow-empty to enqueue an empty job"
    ], r.err
    assert r.out == "" and check_tree(qpath).all_ids == frozenset()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    r = steadq("put", qpath, empty)
    assert r.code == 1 and f"the payload is empty ({empty} has no bytes)" in r.err, r
    assert check_tree(qpath).all_ids == frozenset()
    r = steadq("put", qpath, "--allow-empty", stdin=b"")
    assert r.code == 0 and r.out_lines[0].startswith("job_id: "), r
    assert check_tree(qpath).all_ids == {r.out_lines[0].split()[1]}


def test_put_path_enqueues_each_files_absolute_path_not_its_bytes(qpath: str, tmp_path: Path) -> None:
    movie = tmp_path / "movie.mkv"
    movie.write_bytes(b"\x1a\x45\xdf\xa3" * 1000)
    other = tmp_path / "b c.mkv"
    other.write_bytes(b"x")
    r = steadq("put", qpath, "--path", "movie.mkv", "--meta", "kind=video", cwd=str(tmp_path))
    assert r.code == 0 and r.out_lines[0].startswith("job_id: "), r  # one FILE: a single put's lines
    job = r.out_lines[0].split()[1]
    doc = json.loads(steadq("show", qpath, job, "--no-journal", "--json").out)
    assert (doc["payload_head_text"], doc["payload_length"]) == (str(movie), len(str(movie))), doc
    assert doc["metadata"] == {"kind": "video"} and doc["content_type"] == "text/plain"

    r = steadq("put", qpath, "--path", str(movie), str(other), "--print-ids")
    assert r.code == 0, r
    assert [line.split(" ", 1)[1] for line in r.out_lines] == [str(movie), str(other)]
    assert r.err_lines[-1].startswith("enqueued 2 jobs ")
    for line, p in zip(r.out_lines, (movie, other), strict=True):
        doc = json.loads(steadq("show", qpath, line.split()[0], "--no-journal", "--json").out)
        assert doc["payload_head_text"] == str(p)


def test_put_path_refuses_a_missing_file_and_enqueues_none(qpath: str, tmp_path: Path) -> None:
    there = tmp_path / "there.mkv"
    there.write_bytes(b"x")
    r = steadq("put", qpath, "--path", str(there), str(tmp_path / "gone.mkv"))
    assert r.code == 6, r
    assert f"put --path: {tmp_path / 'gone.mkv'}: No such file or directory: nothing was enqueued" in r.err
    assert check_tree(qpath).all_ids == frozenset()
    r = steadq("put", qpath, "--path", str(there), "--dir", str(tmp_path))
    assert r.code == 1 and "one of" in r.err, r


def test_put_lines_makes_one_job_per_non_empty_line(qpath: str, tmp_path: Path) -> None:
    src = tmp_path / "urls.txt"
    src.write_bytes(b"https://a/1\n\nhttps://a/2\r\n   \nlast line without newline")
    r = steadq("put", qpath, "--lines", str(src), "--print-ids")
    assert r.code == 0, r
    assert [line.split(" ", 1)[1] for line in r.out_lines] == [f"{src}:1", f"{src}:3", f"{src}:5"]
    assert r.err_lines[-1].startswith(f"enqueued 3 jobs (47 bytes) from lines of {src} ")
    heads = [steadq("show", qpath, line.split()[0], "--no-journal", "--json").out for line in r.out_lines]
    assert '"payload_head_text": "https://a/1"' in heads[0] and '"payload_head_text": "https://a/2"' in heads[1]
    assert '"content_type": "text/plain"' in heads[2]
    r = steadq("put", qpath, "--lines", stdin=b"one\ntwo\n")  # no FILE: stdin
    assert r.code == 0 and r.err_lines[-1].startswith("enqueued 2 jobs (6 bytes) from lines of stdin "), r
    r = steadq("put", qpath, "--lines", "-", stdin=b"\n\n")
    assert r.code == 0 and r.err_lines[-1].startswith("enqueued 0 jobs "), r
    assert len(check_tree(qpath).ready) == 5


def test_put_lines_interrupted_reports_exactly_what_it_published(qpath: str, tmp_path: Path) -> None:
    src = tmp_path / "many.txt"
    src.write_text("".join(f"/srv/in/frame-{i:05d}.png\n" for i in range(4000)))
    stopped = 0
    for signum, delay in ((signal.SIGINT, 0.0), (signal.SIGTERM, 0.05), (signal.SIGINT, 0.3)):
        before = check_tree(qpath, allow_quarantine=False).all_ids
        # Signalled once the first group's ids are out: publishing is under way.
        code, out, err = _interrupted_put(
            [qpath, "--lines", str(src), "--print-ids"], delay, signum, after_first_id=True
        )
        new = _check_run(qpath, before, code, out, err, signum, 4000)
        assert all(line.split(" ", 1)[1].startswith(f"{src}:") for line in out), out[:3]
        stopped += 0 < len(new) < 4000
    assert stopped, "no run was stopped part-way"


def test_put_path_prints_a_hostile_file_name_escaped(qpath: str, tmp_path: Path) -> None:
    evil = tmp_path / "frame\x1b[2J\nid.png"
    evil.write_bytes(b"x")
    r = steadq("put", qpath, "--path", str(evil), str(evil), "--print-ids")
    assert r.code == 0, r
    assert "\x1b" not in r.out and len(r.out_lines) == 2, r.out  # one line per job, whatever the name holds
    assert all(line.endswith("frame\\x1b[2J\\nid.png") for line in r.out_lines), r.out
    doc = json.loads(steadq("show", qpath, r.out_lines[0].split()[0], "--no-journal", "--json").out)
    assert doc["payload_head_text"] == str(evil)  # the payload is the path itself, byte for byte
