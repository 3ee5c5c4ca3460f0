"""A job's output that is not text is summarised in the journal, never dumped (issue 33 #7).

The reported defect: a command writing a frame or a video to stdout had
every 16 KiB of it logged as a journal entry of replacement characters,
which buried the job's own sentences (its stderr, its verdict) under
garbage, and ``show``'s last journal lines with it.
"""

from __future__ import annotations

import re

from steadqd import Queue

from .conftest import Env

BINARY_SH = r"""
printf 'frame header\n'
head -c 3000 /dev/zero
printf '\n\377\376 tail\n'
printf 'careful: frame 7 is odd\n' >&2
printf 'caf\303\251 latin and utf-8 text\n' >&2
head -c 40000 /dev/zero >&2
"""


def test_binary_output_is_one_summary_line_and_text_lines_stay_lines(denv: Env, daemons) -> None:
    denv.write_config(command=["sh", "-c", BINARY_SH])
    d = daemons(denv)
    with Queue.open(denv.queue_path) as q:
        job = q.enqueue(b"x")
    d.ready()
    fields = rf"STEADQ_ATTEMPT=1 STEADQ_JOB_ID={job}"
    d.wait_log(rf"^<6>worker\[testq\]: frame header {fields} STEADQ_STREAM=stdout$")
    # 3000 NULs, their newline and the 8 bytes of the line after them, from the first line that was not text
    d.wait_log(rf"^<6>worker\[testq\]: <3009 bytes of binary output> {fields} STEADQ_STREAM=stdout$")
    d.wait_log(rf"^<4>worker\[testq\]: careful: frame 7 is odd {fields} STEADQ_STREAM=stderr$")
    d.wait_log(rf"^<4>worker\[testq\]: café latin and utf-8 text {fields} STEADQ_STREAM=stderr$")
    d.wait_log(rf"^<4>worker\[testq\]: <40000 bytes of binary output> {fields} STEADQ_STREAM=stderr$")
    d.wait_log(rf"job {job[:8]} finished: ack")
    log = d.log()
    assert "tail" not in log and "\ufffd" not in log and "\\x00" not in log, log
    assert len(re.findall(rf"STEADQ_JOB_ID={job} STEADQ_STREAM=", log)) == 5, log
