/* steadq_spawn's interface: spawn.c, and the cffi declarations in fastspawn_build.py (keep both alike). */
#ifndef STEADQ_SPAWN_H
#define STEADQ_SPAWN_H

#define STEADQ_SPAWN_OK 0
#define STEADQ_SPAWN_FORK 1  /* vfork itself failed (no child) */
#define STEADQ_SPAWN_SETUP 2 /* descriptors, signals, session, groups, ids, parent-death signal */
#define STEADQ_SPAWN_CHDIR 3 /* the working directory */
#define STEADQ_SPAWN_EXEC 4  /* every candidate's execve failed */

struct steadq_spawn_args {
    char *const *executables; /* candidate paths, tried in turn */
    int n_executables;
    char *const *argv; /* NULL-terminated */
    char *const *envp; /* NULL-terminated */
    const char *cwd;   /* NULL: the worker's */
    int stdin_fd, stdout_fd, stderr_fd;
    const gid_t *groups;
    int ngroups; /* -1: leave the supplementary groups alone */
    long gid;    /* -1: unchanged */
    long uid;    /* -1: unchanged */
    long parent; /* the worker's pid: a child whose parent is another exits 255 */
    long max_fd; /* descriptors below this are closed when close_range is missing */
    int guard_fd;           /* the guard's pipe (close-on-exec, >= 3), or -1: the child writes "+PID" there */
    const char *guard_tail; /* what follows the pid on that line: " JOBID\n" or "\n" */
};

/* The child's pid, or -1 with the failed step in *stage and its errno in *err (the child reaped). */
int steadq_spawn(const struct steadq_spawn_args *a, int *stage, int *err);

#endif
