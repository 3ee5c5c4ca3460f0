"""Every failure ``steadqd.fs.verify`` can report, one test each, against real files.

Verification is what stands between a torn or tampered file and a consumer:
each test writes a job file whose one defect is named in the test, opens it,
and asserts the exact quarantine reason, error kind and message of the
``CorruptObject`` it must raise. A mutated check (a comparison flipped, a
reason swapped, a digest compared to itself) fails one of them.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from steadqd.constants import ENVELOPE_READ_BYTES, HEADER_SIZE, QuarantineReason
from steadqd.errors import CorruptObject, ErrorKind
from steadqd.fs import names, verify
from steadqd.fs.records import build_header
from steadqd.fs.verify import (
    CHUNK,
    Envelope,
    check_name_matches,
    check_object_stat,
    copy_payload,
    read_envelope,
    read_payload,
    reread_envelope,
    verify_payload,
)

JOB = bytes(range(16))
MAX_ATTEMPTS = 3
MAX_PAYLOAD = 8 << 20
EXTENSION = b"\xa1\x61k\x61v"  # verification authenticates the extension, it never parses it


def job_bytes(payload: bytes = b"hello", extension: bytes = EXTENSION) -> bytes:
    """A job file that verifies: header, extension, payload."""
    header = build_header(
        job_id=JOB,
        max_attempts=MAX_ATTEMPTS,
        created_at_ns=1_700_000_000_000_000_000,
        extension=extension,
        payload_length=len(payload),
        payload_digest=hashlib.sha256(payload).digest(),
    )
    return header.encode() + extension + payload


@pytest.fixture
def open_job(tmp_path: Path) -> Iterator:
    """``open_job(data)``: write ``data`` as a job file, return a read-only fd (closed at teardown)."""
    fds: list[int] = []

    def open_(data: bytes, name: str = "job") -> int:
        path = tmp_path / name
        path.write_bytes(data)
        fds.append(os.open(path, os.O_RDONLY))
        return fds[-1]

    yield open_
    for fd in fds:
        os.close(fd)


def corrupt(excinfo: pytest.ExceptionInfo[CorruptObject], reason: QuarantineReason, message: str) -> None:
    """The exact reason, kind and message a failure must carry."""
    err = excinfo.value
    assert err.reason == reason
    assert err.payload is (reason == QuarantineReason.PAYLOAD_CORRUPT)
    assert err.kind is (ErrorKind.PAYLOAD_CORRUPT if err.payload else ErrorKind.QUEUE_CORRUPT)
    assert err.message == message


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


# --------------------------------------------------------------------------- what verifies


@pytest.mark.parametrize("size", [0, 5, ENVELOPE_READ_BYTES, 3 * CHUNK + 7])
def test_a_sound_file_verifies_and_reads_back(open_job, size: int) -> None:
    payload = os.urandom(size)
    data = job_bytes(payload)
    fd = open_job(data)
    env = read_envelope(fd, MAX_PAYLOAD)
    st = os.fstat(fd)
    assert (env.size, env.extension, env.payload_offset) == (len(data), EXTENSION, HEADER_SIZE + len(EXTENSION))
    assert (env.witness.dev, env.witness.ino) == (st.st_dev, st.st_ino)
    assert env.head == data[:ENVELOPE_READ_BYTES]
    assert (env.header.job_id, env.header.payload_length) == (JOB, size)
    assert read_payload(fd, env) == payload
    out = io.BytesIO()
    assert copy_payload(fd, env, out) == size and out.getvalue() == payload
    verify_payload(fd, env)
    check_name_matches(env.header, names.ready_name(JOB, 0, 0, MAX_ATTEMPTS))


def test_an_extension_longer_than_the_first_read_is_read_in_full(open_job) -> None:
    extension = os.urandom(ENVELOPE_READ_BYTES + 100)
    fd = open_job(job_bytes(b"p", extension))
    env = read_envelope(fd, MAX_PAYLOAD)
    assert env.extension == extension and read_payload(fd, env) == b"p"


def test_a_payload_at_exactly_the_queue_maximum_is_accepted(open_job) -> None:
    fd = open_job(job_bytes(b"x" * 10))
    assert read_envelope(fd, 10).header.payload_length == 10


# --------------------------------------------------------------------------- the object's file type


def test_a_directory_is_not_an_object(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(CorruptObject) as info:
            read_envelope(fd, MAX_PAYLOAD)
    finally:
        os.close(fd)
    corrupt(info, QuarantineReason.NON_REGULAR_FILE, "not a regular file")


def test_a_fifo_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    with pytest.raises(CorruptObject) as info:
        check_object_stat(os.lstat(path))
    corrupt(info, QuarantineReason.NON_REGULAR_FILE, "not a regular file")


def test_a_hard_linked_file_is_not_an_object(open_job, tmp_path: Path) -> None:
    fd = open_job(job_bytes())
    os.link(tmp_path / "job", tmp_path / "second-name")
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.UNEXPECTED_HARD_LINK, "has 2 hard links, expected 1")


def test_a_file_whose_links_are_all_gone_is_not_an_object(open_job, tmp_path: Path) -> None:
    fd = open_job(job_bytes())
    os.unlink(tmp_path / "job")
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.UNEXPECTED_HARD_LINK, "has 0 hard links, expected 1")


# --------------------------------------------------------------------------- sizes, checked before reading


@pytest.mark.parametrize("size", [0, 1, HEADER_SIZE - 1])
def test_a_file_shorter_than_the_header(open_job, size: int) -> None:
    fd = open_job(job_bytes()[:size])
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, f"file is {size} bytes, shorter than the 128-byte header")


def test_a_header_that_does_not_decode(open_job) -> None:
    fd = open_job(b"NOTAJOB!" + job_bytes()[8:])
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "job header: bad magic")


def test_a_payload_over_the_queue_maximum_is_refused_before_the_size_check(open_job) -> None:
    # Truncated as well: the maximum is checked first, so the declared length is what is refused.
    fd = open_job(job_bytes(b"x" * 11)[:-3])
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, 10)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "payload length 11 exceeds the queue maximum 10")


@pytest.mark.parametrize(("cut", "extra"), [(1, b""), (len(EXTENSION) + 5, b""), (0, b"\0")])
def test_a_size_other_than_the_headers_sum(open_job, cut: int, extra: bytes) -> None:
    data = job_bytes()
    torn = data[: len(data) - cut] + extra
    fd = open_job(torn)
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, f"file is {len(torn)} bytes, header says {len(data)}")


# --------------------------------------------------------------------------- short reads: the file shrank after fstat


def shrink_after_stat(fd: int, size: int) -> os.stat_result:
    """The stat a caller took before another process truncated the file to ``size``."""
    before = os.fstat(fd)
    writer = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)  # the job's fd is read-only, as the backend's are
    try:
        os.ftruncate(writer, size)
    finally:
        os.close(writer)
    return before


def test_a_short_read_of_the_header(open_job) -> None:
    fd = open_job(job_bytes())
    st = shrink_after_stat(fd, HEADER_SIZE - 1)
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD, st)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "short read of the header")


def test_a_short_read_of_the_extension(open_job) -> None:
    fd = open_job(job_bytes(b"p", os.urandom(ENVELOPE_READ_BYTES + 100)))
    st = shrink_after_stat(fd, ENVELOPE_READ_BYTES + 50)
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD, st)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "short read of the extension")


@pytest.mark.parametrize("size", [10, 2 * CHUNK])
def test_a_payload_that_ends_early(open_job, size: int) -> None:
    fd = open_job(job_bytes(os.urandom(size)))
    st = shrink_after_stat(fd, HEADER_SIZE + len(EXTENSION) + size // 2)
    env = read_envelope(fd, MAX_PAYLOAD, st)  # whole envelope still there: only the payload is torn
    with pytest.raises(CorruptObject) as info:
        read_payload(fd, env)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "payload ends early")


# --------------------------------------------------------------------------- digests


@pytest.mark.parametrize(
    "index",
    [
        10,  # the minor version, which nothing else checks
        56,  # created_at_ns, likewise
        64,  # the stored payload digest
        HEADER_SIZE,  # the first extension byte
        HEADER_SIZE + len(EXTENSION) - 1,  # the last one
        HEADER_SIZE - 1,  # the stored envelope digest itself
    ],
)
def test_an_envelope_digest_mismatch(open_job, index: int) -> None:
    fd = open_job(flip(job_bytes(), index))
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "job header: envelope digest mismatch")


@pytest.mark.parametrize(("size", "at"), [(5, 0), (5, 4), (3 * CHUNK + 7, 0), (3 * CHUNK + 7, 3 * CHUNK + 6)])
def test_a_payload_digest_mismatch(open_job, size: int, at: int) -> None:
    """Small payloads come from the envelope's first read, large ones chunk by chunk: both are checked."""
    data = job_bytes(os.urandom(size))
    offset = len(data) - size
    fd = open_job(flip(data, offset + at))
    env = read_envelope(fd, MAX_PAYLOAD)  # the envelope does not cover the payload
    for consume in (read_payload, verify_payload, lambda fd, env: copy_payload(fd, env, io.BytesIO())):
        with pytest.raises(CorruptObject) as info:
            consume(fd, env)
        corrupt(info, QuarantineReason.PAYLOAD_CORRUPT, "payload digest mismatch")


def test_a_streamed_payload_is_delivered_before_its_digest_fails(open_job) -> None:
    """copy_payload writes every byte and only then raises: the caller must discard the output."""
    data = job_bytes(b"abcdef")
    fd = open_job(flip(data, len(data) - 1))
    env = read_envelope(fd, MAX_PAYLOAD)
    out = io.BytesIO()
    with pytest.raises(CorruptObject) as info:
        copy_payload(fd, env, out)
    assert out.getvalue() == b"abcdeg"
    corrupt(info, QuarantineReason.PAYLOAD_CORRUPT, "payload digest mismatch")


# --------------------------------------------------------------------------- the name against the header


@pytest.mark.parametrize(
    "name",
    [
        names.ready_name(bytes(16), 0, 0, MAX_ATTEMPTS),  # another job id
        names.ready_name(JOB, 0, 0, MAX_ATTEMPTS + 1),  # another attempt limit
    ],
    ids=["job_id", "max_attempts"],
)
def test_a_name_that_does_not_match_the_header(open_job, name: names.JobName) -> None:
    env: Envelope = read_envelope(open_job(job_bytes()), MAX_PAYLOAD)
    with pytest.raises(CorruptObject) as info:
        check_name_matches(env.header, name)
    corrupt(
        info,
        QuarantineReason.FILENAME_HEADER_MISMATCH,
        "name does not match the header (job id or maximum attempts)",
    )


# --------------------------------------------------------------------------- the claim's re-read after its rename


@pytest.mark.parametrize("extension", [EXTENSION, bytes(ENVELOPE_READ_BYTES)], ids=["small", "beyond the first read"])
def test_a_reread_of_the_same_bytes_carries_the_new_read(open_job, tmp_path: Path, extension: bytes) -> None:
    data = job_bytes(b"payload", extension=extension)
    fd = open_job(data)
    env = read_envelope(fd, MAX_PAYLOAD)
    again = reread_envelope(fd, env, MAX_PAYLOAD)
    assert (again.header, again.extension, again.size, again.witness) == (
        env.header,
        env.extension,
        env.size,
        env.witness,
    )
    assert read_payload(fd, again) == b"payload"


@pytest.mark.parametrize("index", [0, 100, HEADER_SIZE, HEADER_SIZE + len(EXTENSION) - 1])
def test_a_reread_that_differs_anywhere_in_the_envelope_is_a_changed_file(open_job, tmp_path: Path, index: int) -> None:
    """The same inode rewritten in place after verification: the claim must not go on."""
    data = job_bytes(b"payload")
    fd = open_job(data)
    env = read_envelope(fd, MAX_PAYLOAD)
    (tmp_path / "job").write_bytes(flip(data, index))  # same inode, same size
    with pytest.raises(CorruptObject) as info:
        reread_envelope(fd, env, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "claimed file changed")


def test_a_reread_of_a_big_extension_that_changed_is_refused(open_job, tmp_path: Path) -> None:
    """Beyond the first read the envelope is verified again in full; a change there is corruption too."""
    data = job_bytes(b"payload", extension=bytes(ENVELOPE_READ_BYTES + 8))
    fd = open_job(data)
    env = read_envelope(fd, MAX_PAYLOAD)
    (tmp_path / "job").write_bytes(flip(data, HEADER_SIZE + ENVELOPE_READ_BYTES + 1))
    with pytest.raises(CorruptObject) as info:
        reread_envelope(fd, env, MAX_PAYLOAD)
    assert info.value.reason == QuarantineReason.ENVELOPE_CORRUPT


def test_a_reread_of_a_file_that_grew_is_a_changed_file(open_job, tmp_path: Path) -> None:
    data = job_bytes(b"payload")
    fd = open_job(data)
    env = read_envelope(fd, MAX_PAYLOAD)
    (tmp_path / "job").write_bytes(data + b"!")
    with pytest.raises(CorruptObject) as info:
        reread_envelope(fd, env, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, "claimed file changed")


# --------------------------------------------------------------------------- reads of bytes that verified before


def test_a_reread_of_bytes_that_verified_skips_both_digests(open_job, monkeypatch: pytest.MonkeyPatch) -> None:
    """payload() and ack read again the small file the claim verified: the same bytes of the same
    inode need neither digest again (with both checks made to fail, the reads still succeed)."""
    fd = open_job(job_bytes(b"payload"))
    verify_payload(fd, read_envelope(fd, MAX_PAYLOAD))  # the claim: both digests checked, the bytes remembered

    def fail(*_: object) -> None:
        raise AssertionError("hashed again")

    monkeypatch.setattr(verify, "check_envelope", fail)
    monkeypatch.setattr(verify, "_check_payload_digest", fail)
    monkeypatch.setattr(verify.JobHeader, "decode", fail)
    env = read_envelope(fd, MAX_PAYLOAD)
    assert read_payload(fd, env) == b"payload"
    verify_payload(fd, env)


def test_a_reread_of_verified_bytes_still_checks_its_stat_and_the_maximum(open_job, tmp_path: Path) -> None:
    """A file of exactly the first read's size verifies, then grows by a byte (its first read is
    unchanged): the size check still refuses it; and a lower queue maximum still refuses its payload."""
    data = job_bytes(os.urandom(ENVELOPE_READ_BYTES - HEADER_SIZE - len(EXTENSION)))
    assert len(data) == ENVELOPE_READ_BYTES
    fd = open_job(data)
    verify_payload(fd, read_envelope(fd, MAX_PAYLOAD))
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, 10)
    n = ENVELOPE_READ_BYTES - HEADER_SIZE - len(EXTENSION)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, f"payload length {n} exceeds the queue maximum 10")
    (tmp_path / "job").write_bytes(data + b"!")
    with pytest.raises(CorruptObject) as info:
        read_envelope(fd, MAX_PAYLOAD)
    corrupt(info, QuarantineReason.ENVELOPE_CORRUPT, f"file is {len(data) + 1} bytes, header says {len(data)}")


@pytest.mark.parametrize(
    ("index", "reason", "message"),
    [
        (0, QuarantineReason.ENVELOPE_CORRUPT, "job header: bad magic"),
        (100, QuarantineReason.ENVELOPE_CORRUPT, "job header: envelope digest mismatch"),
        (HEADER_SIZE + 1, QuarantineReason.ENVELOPE_CORRUPT, "job header: envelope digest mismatch"),
        (HEADER_SIZE + len(EXTENSION) + 2, QuarantineReason.PAYLOAD_CORRUPT, "payload digest mismatch"),
    ],
)
def test_a_verified_file_changed_in_place_is_checked_in_full(
    open_job, tmp_path: Path, index: int, reason: QuarantineReason, message: str
) -> None:
    """The same inode rewritten after it verified (same size, one byte flipped): its new bytes are
    not the remembered ones, so the digests are computed again and the change is caught."""
    data = job_bytes(b"payload")
    fd = open_job(data)
    verify_payload(fd, read_envelope(fd, MAX_PAYLOAD))
    (tmp_path / "job").write_bytes(flip(data, index))  # same inode, same size
    with pytest.raises(CorruptObject) as info:
        read_payload(fd, read_envelope(fd, MAX_PAYLOAD))
    corrupt(info, reason, message)
