// glibc declares sync_file_range only for _GNU_SOURCE, which Swift's Glibc module does not set.
#define _GNU_SOURCE
#include "CDredgeSystem.h"

#if defined(__linux__)
#include <fcntl.h>

int dredge_start_writeback(int fd, int64_t offset, int64_t count) {
    return sync_file_range(fd, (off64_t)offset, (off64_t)count, SYNC_FILE_RANGE_WRITE);
}
#else
int dredge_start_writeback(int fd, int64_t offset, int64_t count) {
    (void)fd; (void)offset; (void)count;
    return 0;
}
#endif
