import Synchronization
import Testing

@testable import DredgeServer

/// The connection wing's one serial primitive: passes one at a time, each over everything asked
/// since the one before began, a task only while something is pending, and a stop that waits.
@Suite struct SerialRunnerTests {
    typealias Runner = SerialRunner<[Int]>

    /// What the passes saw; each pass is held until the test releases it.
    final class Passes: Sendable {
        let seen = Mutex<[[Int]]>([])
        let gates = Mutex<[CheckedContinuation<Runner.After, Never>]>([])
        let inside = Atomic<Int>(0)
        let overlapped = Atomic<Bool>(false)

        func pass(_ pending: [Int]) async -> Runner.After {
            if inside.add(1, ordering: .sequentiallyConsistent).newValue > 1 { overlapped.store(true, ordering: .relaxed) }
            seen.withLock { $0.append(pending) }
            let after = await withCheckedContinuation { continuation in gates.withLock { $0.append(continuation) } }
            inside.subtract(1, ordering: .sequentiallyConsistent)
            return after
        }

        /// Waits until pass number `count` is held.
        func started(_ count: Int) async throws {
            try #require(try await PullOutcomeTests.waitFor(.seconds(60)) { self.gates.withLock { !$0.isEmpty } && self.seen.withLock { $0.count } >= count })
        }

        func release(_ after: Runner.After = .next) {
            gates.withLock { $0.removeFirst() }.resume(returning: after)
        }

        var count: Int { seen.withLock { $0.count } }
    }

    static func runner() -> (Runner, Passes) {
        let passes = Passes()
        return (Runner(empty: []) { await passes.pass($0) }, passes)
    }

    @Test func requestsAskedDuringAPassMakeOneNextPass() async throws {
        let (runner, passes) = Self.runner()
        runner.ask { $0.append(1) }
        try await passes.started(1)
        for n in 2...5 { runner.ask { $0.append(n) } }
        passes.release()
        try await passes.started(2)
        passes.release()
        await runner.idle()
        #expect(passes.seen.withLock { $0 } == [[1], [2, 3, 4, 5]])
        let twoAtOnce = passes.overlapped.load(ordering: .relaxed)
        #expect(!twoAtOnce)
    }

    @Test func idleWaitsForThePassAndWhatItLeftPending() async throws {
        let (runner, passes) = Self.runner()
        await runner.idle()  // nothing asked: at once
        runner.ask { $0.append(1) }
        try await passes.started(1)
        let ended = Atomic<Bool>(false)
        let waiting = Task {
            await runner.idle()
            ended.store(true, ordering: .relaxed)
        }
        #expect(try await PullOutcomeTests.waitFor(.seconds(60)) { runner.parked == 1 })
        runner.ask { $0.append(2) }
        passes.release()
        try await passes.started(2)
        let endedEarly = ended.load(ordering: .relaxed)
        #expect(runner.parked == 1 && !endedEarly, "idle while a second pass was owed")
        passes.release()
        await waiting.value
        let endedNow = ended.load(ordering: .relaxed)
        #expect(endedNow)
        #expect(passes.count == 2)
    }

    /// After `stop()` nothing more runs: what was pending is dropped and later requests are
    /// refused; `stop()` returns only once the running pass has ended.
    @Test func stopWaitsForTheRunningPassAndDropsTheRest() async throws {
        let (runner, passes) = Self.runner()
        runner.ask { $0.append(1) }
        try await passes.started(1)
        runner.ask { $0.append(2) }
        let stopped = Task { await runner.stop() }
        #expect(try await PullOutcomeTests.waitFor(.seconds(60)) { runner.parked == 1 })
        #expect(runner.isStopped)
        #expect(!runner.ask { $0.append(3) }, "refused once stopped")
        passes.release()
        await stopped.value
        #expect(passes.seen.withLock { $0 } == [[1]])
    }

    /// A pass that says `.stop` ends the runner: the request that came meanwhile never runs.
    @Test func aPassCanEndTheRunner() async throws {
        let (runner, passes) = Self.runner()
        runner.ask { $0.append(1) }
        try await passes.started(1)
        runner.ask { $0.append(2) }
        passes.release(.stop)
        await runner.idle()
        #expect(runner.isStopped)
        #expect(passes.seen.withLock { $0 } == [[1]])
        #expect(!runner.ask { $0.append(3) })
    }

    /// Many askers at once: every request reaches exactly one pass, in the order asked per
    /// asker, and passes never overlap.
    @Test func concurrentAskersLoseNothing() async {
        let seen = Mutex<[Int]>([])
        let inside = Atomic<Int>(0)
        let overlapped = Atomic<Bool>(false)
        let runner = Runner(empty: []) { batch in
            if inside.add(1, ordering: .sequentiallyConsistent).newValue > 1 { overlapped.store(true, ordering: .relaxed) }
            seen.withLock { $0 += batch }
            await Task.yield()
            inside.subtract(1, ordering: .sequentiallyConsistent)
            return .next
        }
        await withTaskGroup(of: Void.self) { group in
            for asker in 0..<8 {
                group.addTask {
                    for i in 0..<250 { runner.ask { $0.append(asker * 1_000 + i) } }
                }
            }
        }
        await runner.idle()
        let all = seen.withLock { $0 }
        #expect(all.count == 2_000)
        for asker in 0..<8 {
            let mine = all.filter { $0 / 1_000 == asker }
            #expect(mine == (0..<250).map { asker * 1_000 + $0 })
        }
        let twoAtOnce = overlapped.load(ordering: .relaxed)
        #expect(!twoAtOnce)
    }
}
