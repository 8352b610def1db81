// glibc declares sync_file_range and SCHED_IDLE only for _GNU_SOURCE, which Swift's Glibc module does not set.
#define _GNU_SOURCE
#include "CDredgeSystem.h"

#if defined(__linux__)
#include <errno.h>
#include <fcntl.h>
#include <sched.h>

int dredge_start_writeback(int fd, int64_t offset, int64_t count) {
    return sync_file_range(fd, (off64_t)offset, (off64_t)count, SYNC_FILE_RANGE_WRITE);
}

int dredge_set_idle_policy(int tid) {
    struct sched_param param = { .sched_priority = 0 };
    return sched_setscheduler(tid, SCHED_IDLE, &param);
}

int dredge_has_idle_policy(int tid) {
    int policy = sched_getscheduler(tid);
    return policy < 0 ? -1 : (policy & ~SCHED_RESET_ON_FORK) == SCHED_IDLE;
}
#else
#include <errno.h>

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

int dredge_start_writeback(int fd, int64_t offset, int64_t count) {
    (void)fd; (void)offset; (void)count;
    return 0;
}
#endif
