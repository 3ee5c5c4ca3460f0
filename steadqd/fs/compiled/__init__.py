"""The C core's sources (claim.c, settle.c, publish.c, verify.c, names.c, syscall_table.c; api.h and core.h) and its cffi build; the built module is ``_core``.

steadqd.fs.compiled.bridge loads it and says whether it runs (see there).
"""
