"""The C claim core's sources (claim_core.c) and its cffi build; the built module is ``_claim_core``.

steadqd.fs.claim_fast loads it and says whether it runs (see there).
"""
