"""The C core's sources (claim.c, settle.c, publish.c, verify.c, names.c, syscall_table.c; claim_core.h and core.h) and its cffi build; the built module is ``_claim_core``.

steadqd.fs.claim_fast loads it and says whether it runs (see there).
"""
