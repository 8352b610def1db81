import Synchronization

/// Mutual exclusion by key, for async work: one body at a time per key, the others waiting in
/// order without holding a thread. What keeps two connections of one agent (a new one taking
/// over while the old one still handles a batch) from writing one part of a tail at once.
final class KeyedLock: Sendable {
    /// A key present is held; its list is who waits for it.
    private let state = Mutex<[String: [CheckedContinuation<Void, Never>]]>([:])

    func withLock<T: Sendable>(_ key: String, _ body: () async throws -> T) async rethrows -> T {
        await acquire(key)
        defer { release(key) }
        return try await body()
    }

    private func acquire(_ key: String) async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { held -> Bool in
                guard held[key] != nil else {
                    held[key] = []
                    return true
                }
                held[key]?.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    private func release(_ key: String) {
        let next = state.withLock { held -> CheckedContinuation<Void, Never>? in
            guard var waiting = held[key], !waiting.isEmpty else {
                held[key] = nil
                return nil
            }
            let next = waiting.removeFirst()
            held[key] = waiting
            return next
        }
        next?.resume()
    }
}
