import Foundation
import Synchronization

/// Whether this server should be sent work now: what `GET /ready` answers to a load balancer
/// or an orchestrator (`GET /health` only says the process answers). Ready when every check
/// passes: the database answers, the agent listener listens, and the data directory's file
/// system has room (``ReadinessLimits``). Each check has a few seconds: one that hangs (a
/// database that does not answer) counts as failed, and never holds the answer. Probes that
/// come together share one evaluation, and an answer serves for a second: however often
/// anyone asks (no token is needed), at most one round of checks runs, and checks left hanging
/// cannot pile up.
public final class Readiness: Sendable {
    public struct Check: Sendable {
        public let name: String
        /// Nil when it passes; else what is wrong, in words.
        public let run: @Sendable () async -> String?

        public init(_ name: String, run: @escaping @Sendable () async -> String?) {
            self.name = name
            self.run = run
        }
    }

    public struct Result: Sendable, Equatable {
        public var name: String
        public var problem: String?
    }

    public let checks: [Check]
    /// How long a check may take.
    public let timeout: Duration

    /// How long an answer serves.
    static let reuse: Duration = .seconds(1)
    /// The evaluation running or last finished, and when it finished (nil: still running).
    private let latest = Mutex<(task: Task<[Result], Never>, finished: ContinuousClock.Instant?)?>(nil)

    public init(_ checks: [Check], timeout: Duration = .seconds(5)) {
        self.checks = checks
        self.timeout = timeout
    }

    /// Every check's outcome, in order: the evaluation under way or finished within the last
    /// second, else a new one.
    public func evaluate() async -> [Result] {
        let task = latest.withLock { latest -> Task<[Result], Never> in
            if let latest, latest.finished.map({ ContinuousClock.now - $0 < Self.reuse }) ?? true { return latest.task }
            let task = Task {
                let results = await self.runChecks()
                self.latest.withLock { $0?.finished = .now }
                return results
            }
            latest = (task, nil)
            return task
        }
        return await task.value
    }

    /// Every check run side by side.
    private func runChecks() async -> [Result] {
        let timeout = self.timeout
        return await withTaskGroup(of: (Int, String?).self) { group in
            for (i, check) in checks.enumerated() {
                group.addTask { (i, await Self.within(timeout, check)) }
            }
            var problems = [String?](repeating: nil, count: checks.count)
            for await (i, problem) in group { problems[i] = problem }
            return checks.indices.map { Result(name: checks[$0].name, problem: problems[$0]) }
        }
    }

    /// The check's answer, or a problem once `limit` has passed without one. A check that
    /// hangs is left behind (cancelled), never waited for.
    private static func within(_ limit: Duration, _ check: Check) async -> String? {
        let answer = FirstAnswer<String?>()
        return await withCheckedContinuation { continuation in
            answer.set(continuation)
            let work = Task { answer.finish(await check.run()) }
            let timer = Task {
                do { try await Task.sleep(for: limit) } catch { return }
                work.cancel()
                answer.finish("no answer within \(limit)")
            }
            answer.onFinish { timer.cancel() }
        }
    }
}

extension Readiness.Check {
    /// The database answers a query (``ServerPersistence/ping()``).
    public static func database(_ persistence: ServerPersistence) -> Self {
        Self("database") {
            do {
                try await persistence.ping()
                return nil
            } catch {
                return "the database does not answer: \(error)"
            }
        }
    }

    /// A listener has bound its port.
    public static func listening(_ name: String, port: @escaping @Sendable () -> Int?) -> Self {
        Self(name) { port() == nil ? "not listening yet" : nil }
    }

    /// The file system of `directory` has at least `minimumMegabytes` free (for the server's
    /// own user: what `statvfs` calls available). Asked on a thread of its own: a file system
    /// that hangs (a lost network mount) holds no thread the server's tasks run on.
    public static func disk(_ directory: String, minimumMegabytes: Int) -> Self {
        Self("disk") {
            guard let space = await FileSystemSpace.read(directory) else { return "cannot read the free space of the data directory's file system" }
            let free = Int(space.free / 1_048_576)
            return free < minimumMegabytes ? "\(free) MB free in the data directory's file system, under the \(minimumMegabytes) MB required" : nil
        }
    }
}

/// What `GET /ready` answers: `ready` or `not ready`, and each check's `ok` or problem.
struct ReadinessAnswer: Encodable {
    var status: String
    var checks: [String: String]
}

/// `"readiness"` in `server.json`: when `GET /ready` says the server is not ready.
public struct ReadinessLimits: Codable, Sendable, Equatable {
    /// Megabytes that must be free in the data directory's file system. Default 1,024.
    public var minFreeDiskMegabytes: Int

    public init(minFreeDiskMegabytes: Int = 1_024) { self.minFreeDiskMegabytes = minFreeDiskMegabytes }

    public static let `default` = ReadinessLimits()

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        minFreeDiskMegabytes = try c.decodeIfPresent(Int.self, forKey: .minFreeDiskMegabytes) ?? Self.default.minFreeDiskMegabytes
        guard minFreeDiskMegabytes >= 0 else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "minFreeDiskMegabytes must be 0 or more"))
        }
    }
}
