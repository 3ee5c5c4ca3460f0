"""``steadq``: the command producers, consumers and operators type.

One module per command group, each holding its argument parser beside its
handler (``put``, lease and settle, the read-only views, maintenance, admin,
doctor, bench, completion); ``main`` assembles them. Commands reach a queue only
through ``steadqd.backend``, so every command works the same on any backend.
"""
