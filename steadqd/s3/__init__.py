"""StowQ/1: the same job queue on an S3-compatible object store.

A queue is a key prefix in a bucket. A job is an immutable object whose key
carries its identity; taking it is creating the next numbered claim object
with a conditional create (``If-None-Match: *``), so the store picks the one
winner and the claim number is the fencing token; ack, retry and bury are
conditional creates too, and the only overwrite is the watermark (CAS with
``If-Match``). Time is the store's: every deadline is measured against
timestamps the store assigned, never a worker's clock. The format is the
reference's StowQ/1, byte for byte, so a queue written by either is usable
by the other; ``docs/stowq.md`` says what works today and ``docs/stowq-format.md`` the bytes.

Module map, lowest layer first (``lint-imports`` holds the format modules
apart from the store layer, and this package apart from ``steadqd.fs``):

* format (pure code, no I/O; ``../shared/spec-stowq/vectors`` replays it):

  - ``timemath``: buckets, floors, bounded deadlines, lease expiry,
    admissibility, the watermark advance;
  - ``retry``: the nack backoff with its deterministic jitter;
  - ``keys``: every key shape, shards, key tags, quarantine ids, index keys,
    tail hints, the LIST order;
  - ``chain``: attempt accounting, the claim that follows a chain's tail;
  - ``records``: the record envelope, the eight record types, digests,
    feature bits, strict decoding (canonical CBOR is the shared
    ``steadqd.cbor``); ``verify``: the checks a decoded record must still
    pass before it is believed;

* ``store``: the object-store interface, an in-memory store with a fault
  injector, and the S3 client; ``certify``: the store-profile conformance
  suite (P1-P8) that ``init`` and ``open`` run;

* the protocol, over the store interface only:

  - ``layout``: init and open (certification, ``meta/FORMAT``), the open
    queue's keys, record encoding and checked reads;
  - ``resolve``: the create every transition uses, with outcome-unknown
    resolution by reading the key; ``quarantine``: findings about corrupt
    objects; ``clock``: beacons, the floor, the watermark;
  - ``publish`` (enqueue), ``claim`` (the claim chain, takeover),
    ``lease`` (renew), ``settle`` (ack, retry, bury);
  - ``handle``: ``BucketQueue``, the facade with ``steadqd.backend``'s
    method names; ``operator``: ``BucketBackend``, the facade plus handle
    files, with every operation not built yet refused by name;
  - ``url``: ``s3://BUCKET/PREFIX``, parsed, opened or created, with the
    first request's failure explained.

Recovery, sweeps and GC land next; programs reach the queue through
``steadqd.backend.open_queue``, never by importing this package.
"""
