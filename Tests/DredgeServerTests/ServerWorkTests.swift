import Foundation
import NIOPosix
import DredgeTestSupport
import Testing

@testable import DredgeServer

/// The pools a test makes are shut down inside it (``withStopping(_:_:)``).
extension ServerWork: StoppedAtTheEnd {
    public func stop() async throws { await shutdown() }
}

@Suite struct ServerWorkTests {
    /// Upload and unpack threads yield the CPU to the event loops, heartbeats and commands:
    /// every one of their threads runs at the configured nice value, the control pool's at the
    /// process's own.
    @Test func bulkThreadsRunAtALowerPriority() async throws {
        try await withStopping(ServerWork(WorkThreads(control: 2, uploads: 3, unpack: 2, bulkNice: 7))) { (work: ServerWork) async throws in
            let base = ThreadPriority.nice()
            func nices(_ pool: NIOThreadPool, times: Int) async throws -> Set<Int> {
                var seen: Set<Int> = []
                for _ in 0..<times { seen.insert(try await pool.runIfActive { ThreadPriority.nice() }) }
                return seen
            }
            #if os(Linux)
            try #require(base <= 7, "the tests run at nice \(base), above the value tested")
            #expect(try await nices(work.uploads, times: 30) == [7])
            #expect(try await nices(work.unpack, times: 30) == [7])
            #expect(try await nices(work.control, times: 30) == [base])
            #endif
        }
    }

    /// With `bulkIdle`, upload and unpack threads run under `SCHED_IDLE` (a waking event loop
    /// takes their CPU at once); the control pool's do not.
    @Test func bulkThreadsCanRunUnderTheIdlePolicy() async throws {
        try await withStopping(ServerWork(WorkThreads(control: 2, uploads: 3, unpack: 2, bulkNice: 7, bulkIdle: true))) { (work: ServerWork) async throws in
            func idle(_ pool: NIOThreadPool, times: Int) async throws -> Set<Bool> {
                var seen: Set<Bool> = []
                for _ in 0..<times { seen.insert(try await pool.runIfActive { ThreadPriority.hasIdlePolicy() }) }
                return seen
            }
            func ioClasses(_ pool: NIOThreadPool, times: Int) async throws -> Set<Int?> {
                var seen: Set<Int?> = []
                for _ in 0..<times { seen.insert(try await pool.runIfActive { ThreadPriority.ioClass() }) }
                return seen
            }
            #if os(Linux)
            try #require(!ThreadPriority.hasIdlePolicy(), "the tests run under SCHED_IDLE already")
            #expect(work.idlePolicyRefused == nil)
            #expect(try await idle(work.uploads, times: 30) == [true])
            #expect(try await idle(work.unpack, times: 30) == [true])
            #expect(try await idle(work.control, times: 30) == [false])
            // Their disk I/O stays best-effort (2), not the idle class (3) Linux would give them.
            #expect(try await ioClasses(work.uploads, times: 30) == [2])
            #endif
        }
    }

    /// Each pool's threads carry its name, so `top -H` and a profile say which work takes the
    /// CPU; with the bulk threads' priority left alone too, where it stays the process's.
    @Test func everyPoolsThreadsAreNamed() async throws {
        let base = ThreadPriority.nice()
        let baseIdle = ThreadPriority.hasIdlePolicy()
        for threads in [WorkThreads(control: 2, uploads: 3, unpack: 2), WorkThreads(control: 1, uploads: 2, unpack: 1, bulkNice: 0, bulkIdle: false)] {
            try await withStopping(ServerWork(threads)) { (work: ServerWork) async throws in
                func names(_ pool: NIOThreadPool, times: Int) async throws -> Set<String> {
                    var seen: Set<String> = []
                    for _ in 0..<times { seen.insert(try await pool.runIfActive { ThreadPriority.name() }) }
                    return seen
                }
                #if os(Linux)
                #expect(try await names(work.control, times: 20) == ["dredge-control"])
                #expect(try await names(work.uploads, times: 20) == ["dredge-uploads"])
                #expect(try await names(work.unpack, times: 20) == ["dredge-unpack"])
                if threads.bulkNice == 0 && !threads.bulkIdle {
                    for pool in [work.uploads, work.unpack] {
                        for _ in 0..<10 {
                            #expect(try await pool.runIfActive { ThreadPriority.nice() } == base)
                            #expect(try await pool.runIfActive { ThreadPriority.hasIdlePolicy() } == baseIdle)
                        }
                    }
                }
                #endif
            }
        }
    }

    @Test func theNiceValueIsReadFromServerJSONWithinItsRange() throws {
        let decode = { (json: String) throws -> WorkThreads in try JSONDecoder().decode(WorkThreads.self, from: Data(json.utf8)) }
        #expect(try decode("{}").bulkNice == 10)
        #expect(try decode(#"{"bulkNice": 0}"#).bulkNice == 0)
        #expect(try decode(#"{"bulkNice": 40}"#).bulkNice == 19)
        #expect(try decode(#"{"bulkNice": -5}"#).bulkNice == 0)
        #expect(try decode("{}").bulkIdle == true)
        #expect(try decode(#"{"bulkIdle": true}"#).bulkIdle == true)
        #expect(try decode(#"{"bulkIdle": false}"#).bulkIdle == false)
    }
}

