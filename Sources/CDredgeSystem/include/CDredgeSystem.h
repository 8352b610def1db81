#ifndef CDREDGE_SYSTEM_H
#define CDREDGE_SYSTEM_H

#include <stdint.h>

/// Starts writing back the dirty pages of `fd` in [offset, offset + count) without waiting for
/// them (Linux `sync_file_range` with `SYNC_FILE_RANGE_WRITE`), so that the fsync which ends a
/// long sequential write has little left to wait for. A hint: it never makes data durable.
/// Returns 0, or -1 with errno set; 0 and nothing done where the call does not exist.
int dredge_start_writeback(int fd, int64_t offset, int64_t count);

/// Moves the thread `tid` (0: the calling thread) to the `SCHED_IDLE` policy (Linux): it
/// runs at the lowest weight, and any ordinary thread that wakes takes its CPU at once instead
/// of waiting for its time slice to end. Its disk I/O stays in the best-effort class (Linux
/// would put it in the idle class) at the level of its nice value. Needs no privilege for the
/// process's own threads. Returns 0, or -1 with errno set; -1 with ENOSYS where the policy
/// does not exist.
int dredge_set_idle_policy(int tid);

/// The I/O priority of the thread `tid` (0: the calling thread) as Linux's `ioprio_get` gives
/// it (class << 13 | level), or -1 with errno set.
int dredge_io_priority(int tid);

/// Whether the thread `tid` (0: the calling thread) runs under `SCHED_IDLE`: 1, 0, or -1
/// with errno set.
int dredge_has_idle_policy(int tid);

/// Names the calling thread (Linux keeps the first 15 bytes). Returns 0, or an error number;
/// ENOSYS where threads cannot be named.
int dredge_set_thread_name(const char *name);

/// The calling thread's name into `buffer` (at least 16 bytes). Returns 0, or an error number.
int dredge_thread_name(char *buffer, int64_t size);

#endif
