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

/* One spawn handed to the pool's threads; the caller keeps it and what it points to alive until its token
 * comes back on the pool's descriptor. */
struct steadq_spawn_job {
    const struct steadq_spawn_args *args;
    unsigned long long token; /* written to the pool's descriptor once pid/stage/err are set */
    int close_fds[3];         /* closed by the pool's thread after the spawn (-1: none): the caller's ends */
    int nonblock_fds[2];      /* made non-blocking by the pool's thread after the spawn (-1: none): the read ends */
    int nonblocking;          /* 1 once every nonblock_fds[] is non-blocking (0: the caller must do it) */
    int pid, stage, err;      /* steadq_spawn's result */
    struct steadq_spawn_job *next;
};

/* Start the pool's threads (once per process): 0, or an errno. Their children get the calling thread's
 * signal mask; the threads themselves block every signal and never exit. */
int steadq_pool_start(int threads, int notify_fd);
/* Hand a spawn to the pool's threads (never blocks on a spawn). */
void steadq_pool_submit(struct steadq_spawn_job *job);

/* Remove a job's payload copy directory (payload.remove's common case): 0, or rmdir's errno. */
int steadq_remove_copy(const char *dir);
/* Make a job's payload copy directory with its progress file and its payload file open for writing
 * (payload.make, make_progress, write_copy's open): the payload's descriptor, or -errno (nothing made). */
int steadq_make_copy(const char *dir, int dir_len);

#endif
