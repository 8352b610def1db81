import Foundation
import Synchronization

/// Resumes a continuation once, with whichever answer comes first: a piece of work racing its
/// time limit (``Readiness``'s checks, ``ServerMetrics``' readings), where the work may hang and
/// ignore cancellation, so the answer must never wait for it.
final class FirstAnswer<Value: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<Value, Never>?
        var answered = false
        var onFinish: (@Sendable () -> Void)?
    }
    private let state = Mutex(State())

    func set(_ continuation: CheckedContinuation<Value, Never>) { state.withLock { $0.continuation = continuation } }

    /// Runs `body` once answered (at once if it already is).
    func onFinish(_ body: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            if s.answered { return true }
            s.onFinish = body
            return false
        }
        if now { body() }
    }

    /// Answers `answer` unless an answer came first; true if this one did.
    @discardableResult
    func finish(_ answer: Value) -> Bool {
        let (first, continuation, then) = state.withLock { s -> (Bool, CheckedContinuation<Value, Never>?, (@Sendable () -> Void)?) in
            guard !s.answered else { return (false, nil, nil) }
            s.answered = true
            defer { s.continuation = nil; s.onFinish = nil }
            return (true, s.continuation, s.onFinish)
        }
        continuation?.resume(returning: answer)
        then?()
        return first
    }
}

/// The space of a file system (what `statvfs` says), read on a thread of its own: a file
/// system that hangs (a lost network mount) holds no thread the server's tasks run on.
enum FileSystemSpace {
    /// Bytes free to the server's user (`f_bavail`) and in all, or nil when it cannot be read.
    static func read(_ path: String) async -> (free: UInt64, size: UInt64)? {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                var info = statvfs()
                guard statvfs(path, &info) == 0 else { return continuation.resume(returning: nil) }
                continuation.resume(returning: (UInt64(info.f_bavail) * UInt64(info.f_frsize), UInt64(info.f_blocks) * UInt64(info.f_frsize)))
            }
        }
    }
}
