"""cffi (API, out-of-line) build of ``_fastspawn``: spawn.c's one-exec job spawn (``setup.py`` runs it).

``python steadqd/daemon/worker/run/fastspawn_build.py`` builds it in place by hand; ``pip install -e .``
does it through setup.py's ``cffi_modules``. Without it the worker spawns through Popen and
``steadq-exec`` (steadqd.daemon.worker.run.fastspawn says which path runs and why).
"""

from __future__ import annotations

import os

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))

CDEF = """
#define STEADQ_SPAWN_OK 0
#define STEADQ_SPAWN_FORK 1
#define STEADQ_SPAWN_SETUP 2
#define STEADQ_SPAWN_CHDIR 3
#define STEADQ_SPAWN_EXEC 4
typedef int... gid_t;
struct steadq_spawn_args {
    char *const *executables;
    int n_executables;
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int stdin_fd, stdout_fd, stderr_fd;
    const gid_t *groups;
    int ngroups;
    long gid;
    long uid;
    long parent;
    long max_fd;
    int guard_fd;
    const char *guard_tail;
};
int steadq_spawn(const struct steadq_spawn_args *a, int *stage, int *err);
struct steadq_spawn_job {
    const struct steadq_spawn_args *args;
    unsigned long long token;
    int close_fds[3];
    int nonblock_fds[2];
    int nonblocking;
    int pid, stage, err;
    struct steadq_spawn_job *next;
};
int steadq_pool_start(int threads, int notify_fd);
void steadq_pool_submit(struct steadq_spawn_job *job);
int steadq_remove_copy(const char *dir);
int steadq_make_copy(const char *dir, int dir_len);
"""

ffibuilder = cffi.FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "steadqd.daemon.worker.run._fastspawn",
    '#include "spawn.h"',
    sources=[os.path.relpath(os.path.join(HERE, "spawn.c"))],
    include_dirs=[os.path.relpath(HERE)],
    depends=[os.path.relpath(os.path.join(HERE, "spawn.h"))],
    extra_compile_args=["-O2", "-Wall"],
)

if __name__ == "__main__":
    # The name `pip install -e .` gives it (a limited-API build): a by-hand build under the interpreter's own
    # suffix would be imported before it, and a later reinstall would leave that one, stale, in front.
    ffibuilder.compile(tmpdir=os.path.join(HERE, "..", "..", "..", ".."), target="_fastspawn.abi3.so", verbose=True)
