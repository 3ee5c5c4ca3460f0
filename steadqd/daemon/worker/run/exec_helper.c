/*
 * steadq-exec PARENT_PID REPORT_FD GUARD_FD PROGRAM [ARG...]
 *
 * Runs between Popen's fork and the job's command, so that Popen needs no
 * preexec_fn: with one, CPython forks the whole worker instead of using vfork,
 * which costs several milliseconds of CPU per job.
 *
 * Popen has already made the session, changed the uid and gid (which would
 * clear a parent-death signal set earlier) and set up the descriptors. This
 * sets PR_SET_PDEATHSIG(SIGKILL), exits 255 if the worker died before that
 * (the signal would then never come), and executes PROGRAM, searching PATH the
 * way Popen does. REPORT_FD is the write end of the worker's pipe; it is closed
 * by a successful exec, and a failed one writes its errno there in decimal, so
 * the worker reports a start failure as exactly as Popen would.
 *
 * GUARD_FD (-1: none) is the worker's pipe to its guard (guard.py). Before
 * anything else this writes "+PID[ JOBID]" there (its pid is the group id:
 * Popen made the session), the job id from its own STEADQ_JOB_ID when that
 * is one (32 hex digits), so that the guard knows the group before the
 * command can run however late the worker gets back from Popen; any failure
 * after that writes "-PID" before exiting, while the pid is still its own.
 * A failed write (EPIPE: the guard is dead) is no failure: the worker
 * replaces the guard with its whole list. SIGPIPE is ignored around those
 * writes and back to its default (Popen's restore_signals) for the command.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static int parse_long(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int guard_fd = -1, guard_told = 0;

static void sigpipe(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

/* One write of "<sign>PID<tail>" (< PIPE_BUF bytes: atomic on a pipe); 0 when it went out whole. */
static int guard_line(char sign, const char *tail)
{
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%c%ld%s", sign, (long)getpid(), tail);
    if (n < 0 || (size_t)n >= sizeof buf)
        return -1;
    ssize_t w;
    while ((w = write(guard_fd, buf, (size_t)n)) < 0 && errno == EINTR)
        ;
    return w == n ? 0 : -1;
}

static void tell_guard(void)
{
    const char *job = getenv("STEADQ_JOB_ID");
    char tail[40] = "\n";
    if (job != NULL && strlen(job) == 32 && strspn(job, "0123456789abcdef") == 32)
        snprintf(tail, sizeof tail, " %s\n", job);
    sigpipe(SIG_IGN);
    guard_told = guard_line('+', tail) == 0;
    if (fcntl(guard_fd, F_SETFD, FD_CLOEXEC) != 0)
        guard_told = 0; /* cannot happen for a descriptor that was just written */
}

/* A failure after "+PID": take it back before exiting. */
static void untell_guard(void)
{
    if (guard_told) {
        sigpipe(SIG_IGN);
        guard_line('-', "\n");
    }
}

static void report(int fd, int err)
{
    char buf[24];
    untell_guard();
    int n = snprintf(buf, sizeof buf, "%d", err);
    while (write(fd, buf, (size_t)n) < 0 && errno == EINTR)
        ;
    _exit(127);
}

/* Popen's search: each PATH entry in turn; the first error other than
 * ENOENT/ENOTDIR wins, else the last one. An empty entry is the cwd. */
static int exec_search(const char *program, char **argv)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/bin:/usr/bin"; /* os.defpath */
    size_t plen = strlen(program);
    int first = 0, last = ENOENT;
    for (const char *dir = path;;) {
        const char *end = strchrnul(dir, ':');
        size_t dlen = (size_t)(end - dir);
        char candidate[PATH_MAX];
        if (dlen + 1 + plen + 1 > sizeof candidate) {
            last = ENAMETOOLONG;
        } else {
            if (dlen == 0) {
                memcpy(candidate, program, plen + 1);
            } else {
                memcpy(candidate, dir, dlen);
                candidate[dlen] = '/';
                memcpy(candidate + dlen + 1, program, plen + 1);
            }
            execv(candidate, argv);
            last = errno;
        }
        if (last != ENOENT && last != ENOTDIR && first == 0)
            first = last;
        if (*end == '\0')
            break;
        dir = end + 1;
    }
    return first != 0 ? first : last;
}

int main(int argc, char **argv)
{
    long parent, fd, gfd;
    if (argc < 5 || parse_long(argv[1], &parent) != 0 || parse_long(argv[2], &fd) != 0 || fd < 0 || fd > INT_MAX ||
        parse_long(argv[3], &gfd) != 0 || gfd < -1 || gfd > INT_MAX) {
        fputs("usage: steadq-exec PARENT_PID REPORT_FD GUARD_FD PROGRAM [ARG...]\n", stderr);
        return 2;
    }
    if (gfd >= 0) {
        guard_fd = (int)gfd;
        tell_guard();
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        report((int)fd, errno);
    if (getppid() != (pid_t)parent) {
        untell_guard();
        _exit(255);
    }
    if (fcntl((int)fd, F_SETFD, FD_CLOEXEC) != 0)
        report((int)fd, errno);
    sigpipe(SIG_DFL); /* the command's, as Popen left it */
    const char *program = argv[4];
    char **args = argv + 4;
    if (strchr(program, '/') != NULL) {
        execv(program, args);
        report((int)fd, errno);
    }
    report((int)fd, exec_search(program, args));
    return 127;
}
