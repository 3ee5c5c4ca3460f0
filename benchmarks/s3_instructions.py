"""Instructions per S3 call of the default transport, counted by callgrind: a client cost the machine's load does not move.

    .venv/bin/python -m benchmarks.s3_instructions [--against TREE] [--calls 100]

Why instructions: the bucket benchmarks measure CPU time, which rises with
the load other work puts on a shared 2-core machine (cache, scheduling). This
starts one same-host SeaweedFS (tests/stowq/seaweed.py, 127.0.0.1), then for
each call the protocol makes (HEAD and GET of a 100-byte object, LIST of 5
keys, put-if-absent of 100 bytes) runs a child Python under ``valgrind
--tool=callgrind`` twice, making 20 and 20 + ``calls`` calls from one thread,
and reports the difference per call (process start, imports and the opening
cancel out; the server is not traced). ``--against`` counts another source
tree's steadqd (a ``git archive`` of main) the same way. Needs valgrind;
takes about a minute per tree and call kind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BUCKET = "steadq-bench-instr"
KINDS = ("head", "get", "list", "put")
BASE_CALLS = 20


def _child(kind: str, calls: int) -> None:
    from steadqd.s3.store.base import SEAWEEDFS
    from steadqd.s3.store.s3 import S3Settings, S3Store

    store = S3Store(S3Settings(bucket=BUCKET, endpoint_url=os.environ["AWS_ENDPOINT_URL"]), profile=SEAWEEDFS)
    tag = f"{os.getpid()}-{calls}"
    call = {
        "head": lambda i: store.head("k/obj"),
        "get": lambda i: store.get("k/obj"),
        "list": lambda i: store.list_page("k/list/"),
        "put": lambda i: store.put_if_absent(f"k/p/{tag}-{i:08d}", b"z" * 100),
    }[kind]
    for i in range(calls):
        call(i)
    store.close()


def _instructions(tree: Path, kind: str, calls: int, env: dict[str, str]) -> int:
    with tempfile.NamedTemporaryFile(prefix="callgrind.", dir="/tmp") as out:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable]
        cmd += [str(Path(__file__).resolve()), "--child", kind, "--calls", str(calls)]
        subprocess.run(cmd, cwd=tree, env={**env, "PYTHONPATH": str(tree)}, check=True, capture_output=True)
        found = re.search(r"^(?:summary|totals): (\d+)", Path(out.name).read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in callgrind's output for {kind} in {tree}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.s3_instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="calls counted per kind, beyond the first 20")
    parser.add_argument("--against", type=Path, help="another source tree, counted the same way")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.calls)
        return 0
    from benchmarks.bucket_api import weed_and_trees
    from tests.stowq.seaweed import running

    found = weed_and_trees(args.against)
    if found is None:
        return 2
    weed, trees = found
    with tempfile.TemporaryDirectory(prefix="s3-instr-", dir="/var/tmp") as root, running(Path(root), weed) as server:
        store = server.store(BUCKET)
        store.put_if_absent("k/obj", b"x" * 100)
        for i in range(5):
            store.put_if_absent(f"k/list/{i:04d}", b"y")
        store.close()
        env = {**os.environ, **server.environment(), "STEADQ_STORE_PROFILE": "seaweedfs"}
        for kind in KINDS:
            for tree, tag in trees:
                low = _instructions(tree, kind, BASE_CALLS, env)
                high = _instructions(tree, kind, BASE_CALLS + args.calls, env)
                print(f"{kind:5s} {tag:8s} {(high - low) / args.calls:12,.0f} instructions per call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
