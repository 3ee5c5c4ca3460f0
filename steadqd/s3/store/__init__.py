"""The store layer of StowQ/1: one object-store interface and its implementations.

* ``base``: the :class:`ObjectStore` protocol, its result types, the store
  profiles (what each engine promises) and the outcome classes every answer
  is sorted into;
* ``memory``: a linearizable in-memory store with its own store clock, for
  the model and fault tests;
* ``faults``: a wrapper around any store that fails chosen calls the ways a
  network does (before transmit, after it with or without the write applied,
  5xx, slow answers, stale listings where a profile allows them);
* ``s3``: the S3 client over botocore, with conditional writes, SHA-256
  checksums, bounded retries and timeouts, and settings from the standard
  AWS environment only;
* ``s3_direct``: the same requests, signed as botocore signs, over kept
  sockets of its own for plain HTTP without a proxy (``plain_http``) and
  over urllib3's pools for TLS or a proxy (``S3Settings(transport="direct")``,
  the default).

The format modules (``keys``, ``timemath``, ``retry``, ``records``) never
import this package; the protocol sits above both. Each name is imported from
its module (``steadqd.s3.store.base`` for the protocol, profiles and result
types): the package re-exports nothing, so no second list of them can drift.
"""
