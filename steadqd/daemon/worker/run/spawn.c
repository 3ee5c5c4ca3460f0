/*
 * steadq_spawn: one job's command in one vfork and one exec (steadqd/daemon/worker/run/fastspawn.py).
 *
 * The child does, in this order, what Popen's child and steadq-exec did between
 * them (CPython's _posixsubprocess child_exec, then exec_helper.c):
 *   0. "+PID[ JOBID]" to the worker's guard (guard.py), its pid being the
 *      group id it takes at step 4: the guard knows the group before the
 *      command can run, however long the worker takes to return from here
 *      (a SIGKILLed worker's guard kills it). One write of < PIPE_BUF bytes
 *      to a pipe is atomic. A failed write (the guard is dead: EPIPE) is no
 *      failure: the worker replaces the guard with its whole list;
 *   1. stdin/stdout/stderr onto 0, 1, 2 (Popen's care for a source that is
 *      itself 0, 1 or 2: the daemon may run with those closed);
 *   2. chdir to the working directory;
 *   3. every signal the worker catches back to its default, SIGPIPE and
 *      SIGXFSZ too (Popen's restore_signals), then the caller's signal mask;
 *   4. setsid (the job is its own process group and session);
 *   5. setgroups, setregid, setreuid (a job run as another user), in that
 *      order: groups while still privileged, the uid last (raw system calls:
 *      see there why not the C library's);
 *   6. every other descriptor closed (close_range; a loop without it), but
 *      the guard's, which is close-on-exec;
 *   7. PR_SET_PDEATHSIG(SIGKILL), after the uid change, which clears it;
 *      then the check that the worker is still the parent (else the signal
 *      would never come: exit 255 without running anything);
 *   8. execve of each candidate path in turn (Popen's PATH search, the list
 *      made by the caller from the job's own PATH): the first error other
 *      than ENOENT/ENOTDIR wins, else the last one.
 * A child that got past step 0 and fails later tells the guard "-PID" before
 * it exits, while it is alive and its pid cannot be reused.
 *
 * With vfork the parent is suspended until the exec or _exit, and they share
 * memory: a failure is reported through *stage and *err (which step, which
 * errno), the child is reaped here, and the caller raises what Popen raises.
 * Between vfork and exec the child calls only async-signal-safe functions
 * and uses no memory it allocates; all signals are blocked across the vfork
 * so that no handler of the worker runs on the shared memory in the child.
 *
 * Besides, the pool (steadq_pool_*: spawns in C threads that never end, the loop's pipe ends made
 * non-blocking there) and payload.py's steps on a job's payload copy directory in one call each
 * (steadq_make_copy, steadq_remove_copy): one GIL release for the claiming or settling thread instead of
 * one per syscall.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spawn.h"

/* 32-bit ids: the plain calls of the older 32-bit ABIs take 16-bit ones. */
#ifdef SYS_setgroups32
#define SYS_SETGROUPS SYS_setgroups32
#define SYS_SETREGID SYS_setregid32
#define SYS_SETREUID SYS_setreuid32
#else
#define SYS_SETGROUPS SYS_setgroups
#define SYS_SETREGID SYS_setregid
#define SYS_SETREUID SYS_setreuid
#endif

/* The child's own record of its guard line (its stack, not the suspended parent's). */
struct told {
    pid_t pid;
    int told; /* the guard got "+PID": a failure must take it back */
};

/* Write "<sign>PID<tail>" to the guard in one write; 0 when it went out whole. Async-signal-safe. */
static int guard_line(int fd, char sign, pid_t pid, const char *tail)
{
    char buf[128], digits[16];
    size_t n = 0, d = 0, tl = strlen(tail);
    if (tl > sizeof buf - sizeof digits - 1)
        return -1;
    buf[n++] = sign;
    do {
        digits[d++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (d > 0)
        buf[n++] = digits[--d];
    memcpy(buf + n, tail, tl);
    n += tl;
    ssize_t w;
    while ((w = write(fd, buf, n)) < 0 && errno == EINTR)
        ;
    return w == (ssize_t)n ? 0 : -1;
}

/* A failed step after "+PID": take it back. SIGPIPE blocked first, so a guard that died meanwhile costs
 * a pending signal that _exit discards, not the child's report of what failed. */
static void untell(const struct steadq_spawn_args *a, const struct told *t)
{
    if (!t->told)
        return;
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    sigprocmask(SIG_BLOCK, &pipe_only, NULL);
    guard_line(a->guard_fd, '-', t->pid, "\n");
}

/* The child's steps. Returns only on failure: its errno, with the step in *stage (a local of child()). */
static __attribute__((noinline)) int child_steps(const struct steadq_spawn_args *a, const sigset_t *old_mask, int *stage,
                                                 struct told *t)
{
    int in = a->stdin_fd, out = a->stdout_fd, err = a->stderr_fd;

    *stage = STEADQ_SPAWN_SETUP; /* until the exec loop: a failure before it is not the command's */
    if (a->guard_fd >= 3) {
        t->pid = (pid_t)syscall(SYS_getpid);
        t->told = guard_line(a->guard_fd, '+', t->pid, a->guard_tail) == 0;
        if (!t->told) {
            /* Every signal is blocked here, so EPIPE left a SIGPIPE pending, which would kill the child once
             * the mask is restored: ignoring it discards it (step 3 sets the default back). */
            struct sigaction ign;
            memset(&ign, 0, sizeof ign);
            ign.sa_handler = SIG_IGN;
            sigemptyset(&ign.sa_mask);
            sigaction(SIGPIPE, &ign, NULL);
        }
    }
    /* A source on a lower standard descriptor would be overwritten by an earlier dup2 (CPython #12607). */
    if (out == 0 && (out = dup(out)) < 0)
        return errno;
    while (err == 0 || err == 1)
        if ((err = dup(err)) < 0)
            return errno;
    int srcs[3] = {in, out, err};
    for (int target = 0; target < 3; target++) {
        int src = srcs[target];
        if (src == target) {
            int flags = fcntl(src, F_GETFD);
            if (flags < 0 || fcntl(src, F_SETFD, flags & ~FD_CLOEXEC) < 0)
                return errno;
        } else if (dup2(src, target) < 0) {
            return errno;
        }
    }

    if (a->cwd != NULL && chdir(a->cwd) != 0) {
        *stage = STEADQ_SPAWN_CHDIR;
        return errno;
    }

    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (sigaction(sig, NULL, &sa) != 0)
            continue; /* a signal number the C library reserves */
        int restore = sig == SIGPIPE || sig == SIGXFSZ;
        if (restore || (sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL)) {
            sa.sa_handler = SIG_DFL;
            sa.sa_flags = 0;
            sigemptyset(&sa.sa_mask);
            sigaction(sig, &sa, NULL);
        }
    }
    if (sigprocmask(SIG_SETMASK, old_mask, NULL) != 0)
        return errno;

    if (setsid() < 0)
        return errno;
    /* Raw system calls, not the C library's: its setuid family applies the change to every thread it
     * knows of, and in a vfork'd child those are the worker's (shared memory, shared locks). The kernel
     * call changes this task alone, which in the child is the whole process. */
    if (a->ngroups >= 0 && syscall(SYS_SETGROUPS, (long)a->ngroups, a->groups) != 0)
        return errno;
    if (a->gid >= 0 && syscall(SYS_SETREGID, a->gid, a->gid) != 0)
        return errno;
    if (a->uid >= 0 && syscall(SYS_SETREUID, a->uid, a->uid) != 0)
        return errno;

    /* Every descriptor above 2 but the guard's: a failure below still has to tell it; the exec closes it. */
    int closed;
    if (a->guard_fd < 3) {
        closed = syscall(SYS_close_range, 3U, ~0U, 0U) == 0;
    } else {
        unsigned g = (unsigned)a->guard_fd;
        closed = (g == 3 || syscall(SYS_close_range, 3U, g - 1, 0U) == 0) &&
                 syscall(SYS_close_range, g + 1, ~0U, 0U) == 0;
    }
    if (!closed) { /* no close_range (Linux < 5.9): one by one */
        for (long fd = 3; fd < a->max_fd; fd++)
            if (fd != a->guard_fd)
                close((int)fd);
    }

    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return errno;
    if (getppid() != (pid_t)a->parent) {
        untell(a, t);
        _exit(255);
    }

    *stage = STEADQ_SPAWN_EXEC;
    int first = 0, last = ENOENT;
    for (int i = 0; i < a->n_executables; i++) {
        execve(a->executables[i], a->argv, a->envp);
        last = errno;
        if (last != ENOENT && last != ENOTDIR && first == 0)
            first = last;
    }
    return first != 0 ? first : last;
}

/* The child: the caller's *stage and *err are written only on failure (a successful exec leaves them
 * STEADQ_SPAWN_OK); its own variables live below the suspended parent's frame, never in it. */
static __attribute__((noinline, noreturn)) void child(const struct steadq_spawn_args *a, const sigset_t *old_mask,
                                                      int *stage, int *err)
{
    int st = STEADQ_SPAWN_SETUP;
    struct told t = {0, 0};
    int e = child_steps(a, old_mask, &st, &t);
    *err = e;
    *stage = st;
    untell(a, &t);
    _exit(127);
}

/* The spawn; the child takes ``child_mask`` as its signal mask (NULL: the calling thread's). */
static int spawn_masked(const struct steadq_spawn_args *a, const sigset_t *child_mask, int *stage, int *err)
{
    sigset_t all, old_mask;

    *stage = STEADQ_SPAWN_OK;
    *err = 0;
    sigfillset(&all);
    if (pthread_sigmask(SIG_BLOCK, &all, &old_mask) != 0) {
        *stage = STEADQ_SPAWN_SETUP;
        *err = EINVAL;
        return -1;
    }
    pid_t pid = vfork();
    if (pid == 0) /* the caller's memory, which the suspended parent reads after _exit */
        child(a, child_mask != NULL ? child_mask : &old_mask, stage, err);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (pid < 0) {
        *stage = STEADQ_SPAWN_FORK;
        *err = fork_errno;
        return -1;
    }
    if (*stage != STEADQ_SPAWN_OK) {
        /* It has exited already (vfork resumed us at its _exit): reap it, as Popen does. */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        return -1;
    }
    return pid;
}

int steadq_spawn(const struct steadq_spawn_args *a, int *stage, int *err)
{
    return spawn_masked(a, NULL, stage, err);
}

/*
 * The pool: a few threads that spawn, so that the worker's loop never waits
 * in vfork for a child to reach its exec (the wait overlaps the loop's work
 * and the other spawns). They are C threads: no Python, no GIL, and they
 * never exit. That matters: PR_SET_PDEATHSIG fires when the *thread* that
 * forked the child ends, not the process, so a spawning thread must outlive
 * every job it started; these live as long as the process. They block every
 * signal (the process's signals go to its other threads), and give their
 * children the mask of the thread that started the pool. A finished spawn's
 * token goes to notify_fd in one write (8 bytes < PIPE_BUF: atomic).
 */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cond = PTHREAD_COND_INITIALIZER;
static struct steadq_spawn_job *pool_head, *pool_tail;
static sigset_t pool_child_mask;
static int pool_fd = -1;
static int pool_threads;

static void *pool_thread(void *unused)
{
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&pool_lock);
        while (pool_head == NULL)
            pthread_cond_wait(&pool_cond, &pool_lock);
        struct steadq_spawn_job *j = pool_head;
        pool_head = j->next;
        if (pool_head == NULL)
            pool_tail = NULL;
        pthread_mutex_unlock(&pool_lock);

        j->pid = spawn_masked(j->args, &pool_child_mask, &j->stage, &j->err);
        for (int i = 0; i < 3; i++)
            if (j->close_fds[i] >= 0)
                close(j->close_fds[i]);
        /* The loop's ends of the output pipes, non-blocking here (no GIL): two ioctls fewer in the loop. */
        int nonblocking = 1;
        for (int i = 0; i < 2; i++) {
            int on = 1;
            if (j->nonblock_fds[i] >= 0 && ioctl(j->nonblock_fds[i], FIONBIO, &on) != 0)
                nonblocking = 0;
        }
        j->nonblocking = nonblocking;
        unsigned long long token = j->token; /* after the write the caller may free j */
        const char *p = (const char *)&token;
        size_t left = sizeof token;
        while (left > 0) {
            ssize_t w = write(pool_fd, p, left);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                break; /* the loop's end is gone: the process is ending */
            }
            p += w;
            left -= (size_t)w;
        }
    }
    return NULL;
}

/* payload.remove's common case in one call (one GIL release for the settling thread instead of five):
 * the directory opened without following a symlink, its own two files unlinked through it (the directory
 * made 0700 first only where an unlink is refused), the directory removed. 0: removed or gone; else
 * rmdir's errno, and the caller walks what is left (a command may have written more there). */
int steadq_remove_copy(const char *dir)
{
    static const char *const own[] = {"payload", "progress"};
    int opened_up = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    for (int i = 0; fd >= 0 && i < 2; i++) {
        if (unlinkat(fd, own[i], 0) == 0 || (errno != EACCES && errno != EPERM))
            continue;
        if (!opened_up) {
            (void)fchmod(fd, 0700);
            opened_up = 1;
        }
        (void)unlinkat(fd, own[i], 0);
    }
    int rc = rmdir(dir) == 0 ? 0 : errno;
    if (rc == ENOENT)
        rc = 0;
    if (rc != 0 && fd >= 0 && !opened_up)
        (void)fchmod(fd, 0700);
    if (fd >= 0)
        close(fd);
    return rc;
}

/* payload.make, make_progress and write_copy's open in one call (one GIL release for the claiming thread
 * instead of four), for a command run as the daemon's user: the directory (0700; it must not exist), its
 * empty "progress" (0600) and its "payload" (0400, open for writing): the payload's descriptor, or
 * -errno with nothing left behind. Modes as the umask leaves them, as os.mkdir and os.open. */
int steadq_make_copy(const char *dir, int dir_len)
{
    char path[PATH_MAX];
    if (dir_len < 0 || dir_len + (int)sizeof "/progress" > PATH_MAX)
        return -ENAMETOOLONG;
    if (mkdir(dir, 0700) != 0)
        return -errno;
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
    memcpy(path, dir, (size_t)dir_len);
    memcpy(path + dir_len, "/progress", sizeof "/progress");
    int fd = open(path, flags, 0600);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0)
        close(fd);
    if (err == 0) {
        memcpy(path + dir_len, "/payload", sizeof "/payload");
        fd = open(path, flags, 0400);
        if (fd >= 0)
            return fd;
        err = errno;
        memcpy(path + dir_len, "/progress", sizeof "/progress");
        (void)unlink(path);
    }
    (void)rmdir(dir);
    return -err;
}

int steadq_pool_start(int threads, int notify_fd)
{
    sigset_t all, old_mask;
    pthread_attr_t attr;
    int rc = 0;

    pthread_mutex_lock(&pool_lock);
    if (pool_threads > 0) {
        pthread_mutex_unlock(&pool_lock);
        return 0;
    }
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_mask); /* the threads start with every signal blocked */
    pool_child_mask = old_mask;
    pool_fd = notify_fd;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        rc = pthread_create(&t, &attr, pool_thread, NULL);
        if (rc != 0)
            break;
        pool_threads++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    pthread_mutex_unlock(&pool_lock);
    return pool_threads > 0 ? 0 : rc;
}

void steadq_pool_submit(struct steadq_spawn_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&pool_lock);
    if (pool_tail != NULL)
        pool_tail->next = job;
    else
        pool_head = job;
    pool_tail = job;
    pthread_cond_signal(&pool_cond);
    pthread_mutex_unlock(&pool_lock);
}
