#ifndef CDREDGE_SYSTEM_H
#define CDREDGE_SYSTEM_H

#include <stdint.h>

/// Starts writing back the dirty pages of `fd` in [offset, offset + count) without waiting for
/// them (Linux `sync_file_range` with `SYNC_FILE_RANGE_WRITE`), so that the fsync which ends a
/// long sequential write has little left to wait for. A hint: it never makes data durable.
/// Returns 0, or -1 with errno set; 0 and nothing done where the call does not exist.
int dredge_start_writeback(int fd, int64_t offset, int64_t count);

#endif
