// An LD_PRELOAD shim that stops a process at a chosen write to its output files.
//
// Every write(2)-family call on a file whose path contains $KILL_MATCH is counted, and so is
// every rename of such a file (a run's last step is one). Once armed
// with killwrite_arm(k, enospc), the process is SIGKILLed just before its k-th such write
// (what is on disk is then what the first k - 1 writes made), or, with enospc, that write and
// every later one fail with ENOSPC, as on a full disk. tests/crash/driver.py arms it in each
// forked child through ctypes; a plain process is armed by $KILL_AT and $KILL_MODE=enospc.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long counter = 0;
static long stop_at = -1;
static int enospc = 0;

void killwrite_arm(long at, int fail_with_enospc) {
    counter = 0;
    stop_at = at;
    enospc = fail_with_enospc;
}

long killwrite_count(void) { return counter; }

__attribute__((constructor)) static void arm_from_environment(void) {
    const char *at = getenv("KILL_AT"), *mode = getenv("KILL_MODE");
    if (at) killwrite_arm(atol(at), mode && strcmp(mode, "enospc") == 0);
}

static int watched(int fd) {
    const char *match = getenv("KILL_MATCH");
    if (!match) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return strstr(path, match) != NULL;
}

// 1: let the write happen; 0: fail it with ENOSPC
static int counted(void) {
    counter++;
    if (stop_at > 0 && counter >= stop_at) {
        if (enospc) {
            errno = ENOSPC;
            return 0;
        }
        kill(getpid(), SIGKILL);
    }
    return 1;
}

static int allowed(int fd) { return watched(fd) ? counted() : 1; }

#define REAL(name, ret, ...)                                    \
    static ret (*real_##name)(__VA_ARGS__) = NULL;              \
    if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name);

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write, ssize_t, int, const void *, size_t);
    return allowed(fd) ? real_write(fd, buf, count) : -1;
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite, ssize_t, int, const void *, size_t, off_t);
    return allowed(fd) ? real_pwrite(fd, buf, count, offset) : -1;
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite64, ssize_t, int, const void *, size_t, off_t);
    return allowed(fd) ? real_pwrite64(fd, buf, count, offset) : -1;
}

ssize_t writev(int fd, const struct iovec *iov, int n) {
    REAL(writev, ssize_t, int, const struct iovec *, int);
    return allowed(fd) ? real_writev(fd, iov, n) : -1;
}

ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t offset) {
    REAL(pwritev, ssize_t, int, const struct iovec *, int, off_t);
    return allowed(fd) ? real_pwritev(fd, iov, n, offset) : -1;
}

int rename(const char *from, const char *to) {
    REAL(rename, int, const char *, const char *);
    const char *match = getenv("KILL_MATCH");
    if (match && strstr(from, match) && !counted()) return -1;
    return real_rename(from, to);
}

int renameat(int from_dir, const char *from, int to_dir, const char *to) {
    REAL(renameat, int, int, const char *, int, const char *);
    const char *match = getenv("KILL_MATCH");
    if (match && strstr(from, match) && !counted()) return -1;
    return real_renameat(from_dir, from, to_dir, to);
}
