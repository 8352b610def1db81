/// Something a test starts in its own process (a server, an agent, a background service) and
/// must stop, and wait for, before the test ends.
public protocol StoppedAtTheEnd: Sendable {
    /// Stops and returns once everything it started has ended; throws what it failed with.
    func stop() async throws
}

/// Runs `body` with `started`, then stops it and waits until it has stopped, whether `body`
/// returned or threw: nothing a test starts outlives the test, its temporary directory or its
/// mount. When `body` threw, that error is the one rethrown (a failed stop after it is a
/// consequence); when it returned, a failed stop fails the test.
public func withStopping<S: StoppedAtTheEnd, R>(
    _ started: S, _ body: (S) async throws -> R
) async throws -> R {
    let outcome: Result<R, any Error>
    do {
        outcome = .success(try await body(started))
    } catch {
        outcome = .failure(error)
    }
    do {
        try await started.stop()
    } catch {
        if case .success = outcome { throw error }
    }
    return try outcome.get()
}

/// Runs `work` in a task beside `body`, then cancels it and waits for it to end, whether `body`
/// returned or threw: for a client's `run()` loop or a listener that a test starts and that
/// ends only when cancelled. What `work` throws on cancellation is not an error of the test.
public func withBackground<R>(
    _ work: @escaping @Sendable () async throws -> Void, _ body: () async throws -> R
) async throws -> R {
    let task = Task { try await work() }
    let outcome: Result<R, any Error>
    do {
        outcome = .success(try await body())
    } catch {
        outcome = .failure(error)
    }
    task.cancel()
    _ = await task.result
    return try outcome.get()
}
