@testable import DredgeServer
import Testing

/// ``KeyedLock``: one body at a time per key, in the order they asked.
@Suite struct KeyedLockTests {
    actor Trace {
        var inside: [String: Int] = [:]
        var most = 0
        var order: [Int] = []
        func enter(_ key: String, _ n: Int) {
            inside[key, default: 0] += 1
            most = max(most, inside[key] ?? 0)
            order.append(n)
        }
        func leave(_ key: String) { inside[key, default: 0] -= 1 }
    }

    @Test func oneBodyAtATimePerKey() async throws {
        let lock = KeyedLock()
        let trace = Trace()
        await withTaskGroup(of: Void.self) { group in
            for n in 0..<50 {
                group.addTask {
                    await lock.withLock("part") {
                        await trace.enter("part", n)
                        for _ in 0..<3 { await Task.yield() }
                        await trace.leave("part")
                    }
                }
            }
        }
        #expect(await trace.most == 1)
        #expect(await trace.order.count == 50)
        // A lock of another key is not held meanwhile, and the lock is free again after.
        #expect(await lock.withLock("other") { 7 } == 7)
        #expect(await lock.withLock("part") { 8 } == 8)
    }
}
