import Foundation

/// One running server per data directory on SQLite: an exclusive `flock` on `server.lock` in
/// the directory, taken before anything is opened and held while the server runs. The kernel
/// lets go of it when the process ends, however it ends, so a killed server leaves nothing to
/// clean up. A second `dredge-server run` on the same directory is refused, naming the holder's
/// pid (written into the file), instead of starting beside it: its start would mark the first
/// one's agents offline, and the two would share one database's writers.
///
/// Not taken on PostgreSQL, where the nodes of a cluster share one data directory by design
/// (each node has an identity of its own, new at each start).
public final class DataDirectoryLock: Sendable {
    public static let fileName = "server.lock"
    private let descriptor: Int32

    private init(descriptor: Int32) { self.descriptor = descriptor }

    /// Takes the lock of `directory`, or throws ``DeploymentError`` saying who holds it.
    public static func acquire(_ directory: String) throws -> DataDirectoryLock {
        let path = directory + "/" + fileName
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DeploymentError("cannot open \(path): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            defer { close(fd) }
            guard code == EWOULDBLOCK else { throw DeploymentError("cannot lock \(path): \(String(cString: strerror(code)))") }
            let holder = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""  // the message only
            let who = Int32(holder).map { "pid \($0)" } ?? "pid unknown"
            throw DeploymentError(
                "the data directory \(directory) is in use by another dredge-server (\(who)); stop it first, or give this one a data directory of its own")
        }
        let pid = Array("\(getpid())\n".utf8)
        guard ftruncate(fd, 0) == 0, pid.withUnsafeBytes({ pwrite(fd, $0.baseAddress, $0.count, 0) }) == pid.count else {
            let code = errno
            close(fd)
            throw DeploymentError("cannot write \(path): \(String(cString: strerror(code)))")
        }
        return DataDirectoryLock(descriptor: fd)
    }

    deinit { close(descriptor) }  // closing the descriptor releases the lock
}
