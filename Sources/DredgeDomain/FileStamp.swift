#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What tells a file changed or was replaced without reading it: its inode, size and
/// modification time (nil: the file does not exist). The server's key ring and the agent's
/// upload policy read their files again when it differs.
public struct FileStamp: Equatable, Sendable {
    public let inode: UInt64, size: Int64, modified: Int64, modifiedNanoseconds: Int

    public init?(_ path: String) {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        inode = UInt64(info.st_ino)
        size = Int64(info.st_size)
        modified = Int64(info.st_mtim.tv_sec)
        modifiedNanoseconds = Int(info.st_mtim.tv_nsec)
    }
}

/// Seconds on the monotonic clock (never set back), for pacing and schedules that compute in
/// seconds: the agent's upload policy and the server's ingress cap.
public enum MonotonicClock {
    public static func seconds() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}
