import ServiceLifecycle

/// The loop of the server's periodic services (the certificate's renewal, the key ring's
/// refresh, SQLite's checkpoints): a pass every `every` until the server stops gracefully or
/// the task is cancelled. A pass that fails is handed to `failed` at most once per
/// `reportEvery` (a fault that lasts is not logged at every turn), and tried again next turn.
enum Periodic {
    static func run(every: Duration, reportEvery: Duration, _ pass: () async throws -> Void, failed: (any Error) -> Void) async {
        var lastReported: ContinuousClock.Instant?
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: every) }
            } catch {
                break
            }
            do {
                try await pass()
            } catch {
                let now = ContinuousClock.now
                if lastReported.map({ now - $0 >= reportEvery }) ?? true {
                    lastReported = now
                    failed(error)
                }
            }
        }
    }
}
