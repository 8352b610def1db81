import Dispatch
import Foundation
import Synchronization
import Testing

@testable import DredgeServer

/// The chunk pipeline on its own (no upload, store or file): chunks commit in the order they
/// arrived whatever order their writes finish in, one committer at a time, at most `capacity`
/// at once, a key twice only once, and `idle()` waits for everything taken in.
@Suite struct ChunkPipelineTests {
    typealias Pipeline = ChunkPipeline<Int, String>

    /// What was committed, batch by batch.
    final class Commits: Sendable {
        let batches = Mutex<[[Int]]>([])
        var all: [Int] { batches.withLock { $0.flatMap { $0 } } }
        func record(_ batch: [(key: Int, outcome: String)]) {
            batches.withLock { $0.append(batch.map(\.key)) }
        }
    }

    @Test func writesThatFinishOutOfOrderCommitInArrivalOrder() async {
        let pipeline = Pipeline(capacity: 8)
        let commits = Commits()
        for key in 0..<4 { #expect(pipeline.admit(key)) }
        pipeline.written(2, "c") { commits.record($0) }
        pipeline.written(1, "b") { commits.record($0) }
        #expect(commits.all.isEmpty, "nothing commits while the first chunk is being written")
        #expect(pipeline.count == 4)
        pipeline.written(0, "a") { commits.record($0) }
        #expect(commits.batches.withLock { $0 } == [[0, 1, 2]], "the front and every written chunk behind it, in one batch")
        pipeline.written(3, "d") { commits.record($0) }
        #expect(commits.all == [0, 1, 2, 3])
        #expect(pipeline.count == 0)
    }

    @Test func outcomesReachTheCommitWithTheirKeys() {
        let pipeline = Pipeline(capacity: 2)
        #expect(pipeline.admit(7) && pipeline.admit(9))
        var seen: [(Int, String)] = []
        pipeline.written(9, "nine") { seen += $0.map { ($0.key, $0.outcome) } }
        pipeline.written(7, "seven") { seen += $0.map { ($0.key, $0.outcome) } }
        #expect(seen.map(\.0) == [7, 9] && seen.map(\.1) == ["seven", "nine"])
    }

    /// A chunk sent again while its first copy is still in the pipeline (written or being
    /// committed) is refused; once committed, the key may come again.
    @Test func aKeyStillInThePipelineIsRefused() {
        let pipeline = Pipeline(capacity: 8)
        #expect(pipeline.admit(1))
        #expect(!pipeline.admit(1), "refused while being written")
        var duringCommit: Bool?
        pipeline.written(1, "x") { _ in duringCommit = pipeline.admit(1) }
        #expect(duringCommit == false, "refused while being committed")
        #expect(pipeline.admit(1), "taken again once committed")
    }

    @Test func roomWaitsWhileThePipelineIsFull() async throws {
        let pipeline = Pipeline(capacity: 2)
        await pipeline.room()
        #expect(pipeline.admit(0))
        await pipeline.room()
        #expect(pipeline.admit(1))
        let gotRoom = Mutex(false)
        let waiting = Task {
            await pipeline.room()
            gotRoom.withLock { $0 = true }
        }
        #expect(try await PullOutcomeTests.waitFor(.seconds(60)) { pipeline.parked.room == 1 })
        // The second chunk's write finishing frees nothing: the first still holds the front.
        pipeline.written(1, "b") { _ in Issue.record("nothing may commit before the front") }
        #expect(pipeline.count == 2)
        #expect(pipeline.parked.room == 1 && !gotRoom.withLock { $0 })
        pipeline.written(0, "a") { _ in }
        await waiting.value
        #expect(gotRoom.withLock { $0 })
    }

    @Test func idleWaitsForEveryChunkTakenIn() async throws {
        let pipeline = Pipeline(capacity: 4)
        await pipeline.idle()  // empty: at once
        #expect(pipeline.admit(0) && pipeline.admit(1))
        let ended = Mutex(false)
        let waiting = Task {
            await pipeline.idle()
            ended.withLock { $0 = true }
        }
        #expect(try await PullOutcomeTests.waitFor(.seconds(60)) { pipeline.parked.idle == 1 })
        pipeline.written(0, "a") { _ in }
        #expect(pipeline.parked.idle == 1 && !ended.withLock { $0 }, "one chunk is still being written")
        pipeline.written(1, "b") { _ in }
        await waiting.value
        #expect(ended.withLock { $0 })
    }

    /// Writes finishing on many threads at once: every chunk commits once, in arrival order,
    /// and never two commits at the same time.
    @Test func concurrentWritersCommitInOrderOneAtATime() async {
        let pipeline = Pipeline(capacity: 8)
        let commits = Commits()
        let committing = Atomic<Int>(0)
        let overlapped = Atomic<Bool>(false)
        let total = 2_000
        let pool = DispatchQueue(label: "writers", attributes: .concurrent)
        let group = DispatchGroup()
        for key in 0..<total {
            await pipeline.room()
            #expect(pipeline.admit(key))
            group.enter()
            pool.async {
                pipeline.written(key, "\(key)") { batch in
                    if committing.add(1, ordering: .sequentiallyConsistent).newValue != 1 { overlapped.store(true, ordering: .relaxed) }
                    commits.record(batch)
                    committing.subtract(1, ordering: .sequentiallyConsistent)
                }
                group.leave()
            }
        }
        await pipeline.idle()
        group.wait()
        #expect(commits.all == Array(0..<total))
        let twoAtOnce = overlapped.load(ordering: .relaxed)
        #expect(!twoAtOnce)
        #expect(pipeline.count == 0)
    }
}
