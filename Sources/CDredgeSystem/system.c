// glibc declares sync_file_range, SCHED_IDLE and pthread_setname_np only for _GNU_SOURCE, which Swift's Glibc module does not set.
#define _GNU_SOURCE
#include "CDredgeSystem.h"

#if defined(__linux__)
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

int dredge_start_writeback(int fd, int64_t offset, int64_t count) {
    return sync_file_range(fd, (off64_t)offset, (off64_t)count, SYNC_FILE_RANGE_WRITE);
}

int dredge_set_idle_policy(int tid) {
    struct sched_param param = { .sched_priority = 0 };
    if (sched_setscheduler(tid, SCHED_IDLE, &param) != 0) return -1;
    // Without an I/O priority of its own, a SCHED_IDLE thread's disk I/O is in the idle class,
    // which some I/O schedulers (BFQ) serve only when no other I/O waits: keep it best-effort,
    // at the level its nice value gives it ((nice + 20) / 5), as before.
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)tid);
    if (nice == -1 && errno != 0) return -1;
    int level = (nice + 20) / 5;
    if (level < 0) level = 0;
    if (level > 7) level = 7;
    const int whoProcess = 1, classBestEffort = 2, classShift = 13;  // linux/ioprio.h
    return (int)syscall(SYS_ioprio_set, whoProcess, tid, (classBestEffort << classShift) | level);
}

int dredge_io_priority(int tid) {
    const int whoProcess = 1;
    return (int)syscall(SYS_ioprio_get, whoProcess, tid);
}

int dredge_has_idle_policy(int tid) {
    int policy = sched_getscheduler(tid);
    return policy < 0 ? -1 : (policy & ~SCHED_RESET_ON_FORK) == SCHED_IDLE;
}

int dredge_set_thread_name(const char *name) {
    char shortened[16];
    strncpy(shortened, name, sizeof shortened - 1);
    shortened[sizeof shortened - 1] = 0;
    return pthread_setname_np(pthread_self(), shortened);
}

int dredge_thread_name(char *buffer, int64_t size) {
    return pthread_getname_np(pthread_self(), buffer, (size_t)size);
}
#else
#include <errno.h>

int dredge_set_thread_name(const char *name) {
    (void)name;
    return ENOSYS;
}

int dredge_thread_name(char *buffer, int64_t size) {
    (void)buffer; (void)size;
    return ENOSYS;
}

int dredge_set_idle_policy(int tid) {
    (void)tid;
    errno = ENOSYS;
    return -1;
}

int dredge_has_idle_policy(int tid) {
    (void)tid;
    errno = ENOSYS;
    return -1;
}

int dredge_io_priority(int tid) {
    (void)tid;
    errno = ENOSYS;
    return -1;
}

int dredge_start_writeback(int fd, int64_t offset, int64_t count) {
    (void)fd; (void)offset; (void)count;
    return 0;
}
#endif
