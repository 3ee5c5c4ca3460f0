"""Two Python stages joined by queues: the shape of a local AI/agent pipeline.

Stage 1 (``extract``) takes a document, does the slow model call (here: a word
count standing in for it) and hands its result to stage 2 (``publish``) by
enqueueing a job on the second queue; stage 2 writes the result out. Each
stage is a :func:`steadqd.task`: a crash or a kill at any point loses
nothing, a failure retries with backoff, and a bad document is buried for a
person to look at (``steadq admin dead-list``).

Run it::

    .venv/bin/python examples/agent_pipeline.py --dir /tmp/pipeline --docs 20

It makes both queues under ``--dir`` (if missing), enqueues the documents,
runs both stages as worker processes until every document is published or
buried, stops them with SIGTERM (they drain), and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import sys
import time

import steadqd
from steadqd import Bury, Queue

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--dir", required=True, help="where the two queues and the output go")
parser.add_argument("--docs", type=int, default=20, help="documents to feed in (every 7th is unreadable)")
args, _ = parser.parse_known_args()

EXTRACT = os.path.join(args.dir, "extract")
PUBLISH = os.path.join(args.dir, "publish")
OUT = os.path.join(args.dir, "out")


@steadqd.task(EXTRACT, name="extract", max_attempts=3)
def extract(doc_id: int, text: str) -> None:
    if not text.strip():
        raise Bury(f"document {doc_id} is empty", reason=0x0100)  # an application reason code
    summary = {"doc": doc_id, "words": len(text.split())}  # the model call would go here
    publish.enqueue(summary)


@steadqd.task(PUBLISH, name="publish")
def publish(summary: dict[str, int]) -> None:
    path = os.path.join(OUT, f"{summary['doc']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f)
    os.replace(path + ".tmp", path)  # re-running a job rewrites the same file: effectively once


def _stage(t: steadqd.Task) -> None:
    t.work(concurrency=2, poll=0.2)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(processName)s: %(message)s")
    os.makedirs(OUT, exist_ok=True)
    for path in (EXTRACT, PUBLISH):
        if not os.path.exists(path):
            Queue.init(path, shards=4).close()
    for i in range(args.docs):
        extract.enqueue(i, "" if i % 7 == 3 else f"document number {i} " * (i + 1))
    extract.close()  # a queue handle is not shared across fork: each stage opens its own
    stages = [multiprocessing.Process(target=_stage, args=(t,)) for t in (extract, publish)]
    for p in stages:
        p.start()
    buried = sum(1 for i in range(args.docs) if i % 7 == 3)
    deadline = time.monotonic() + 120
    while len(os.listdir(OUT)) < args.docs - buried and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in stages:
        if p.pid is not None:
            os.kill(p.pid, signal.SIGTERM)
    for p in stages:
        p.join(30)
    published = len([n for n in os.listdir(OUT) if n.endswith(".json")])
    with Queue.open(EXTRACT) as q:
        dead = q.stats()["dead"].objects
    print(f"published {published}, buried {dead}, of {args.docs} documents")
    return 0 if published == args.docs - buried and dead == buried else 1


if __name__ == "__main__":
    sys.exit(main())
