@testable import DredgeServer
import Glibc
import NIOCore
import Testing

@Suite struct ConnectionBuffersTests {
    /// A slot is handed out once, reused first when given back, and none is handed out past
    /// the region.
    @Test func slotsAreHandedOutOnceAndReused() throws {
        let slots = ConnectionBuffers.Slots(slotSize: 16 * 1024, count: 3, keptWarm: 8)
        #expect(slots.isReserved)
        let a = try #require(slots.take()), b = try #require(slots.take()), c = try #require(slots.take())
        #expect(Set([a, b, c]).count == 3)
        #expect([a, b, c].allSatisfy(slots.holds))
        #expect(slots.take() == nil)
        #expect(slots.inUse == 3)
        slots.give(b)
        #expect(slots.inUse == 2)
        #expect(slots.take() == b)
        let elsewhere = UnsafeMutableRawPointer.allocate(byteCount: 16, alignment: 16)
        defer { elsewhere.deallocate() }
        #expect(!slots.holds(elsewhere))
    }

    /// Past the slots kept warm, a slot given back loses its pages: what it held reads as
    /// zeros when it is handed out again. A warm one keeps them and is handed out first.
    @Test func slotsPastTheWarmOnesGiveTheirPagesBack() throws {
        let slots = ConnectionBuffers.Slots(slotSize: 16 * 1024, count: 2, keptWarm: 1)
        let warm = try #require(slots.take()), cold = try #require(slots.take())
        warm.storeBytes(of: 0xAB, as: UInt8.self)
        cold.storeBytes(of: 0xCD, as: UInt8.self)
        slots.give(warm)
        slots.give(cold)
        #expect(slots.inUse == 0)
        #expect(try #require(slots.take()) == warm)
        #expect(warm.load(as: UInt8.self) == 0xAB)
        #expect(try #require(slots.take()) == cold)
        #expect(cold.load(as: UInt8.self) == 0)
    }

    /// Discarding a live buffer's bytes gives back only the whole pages within them, and only
    /// in a slot: a page they share with other bytes keeps its contents, and `malloc`'s memory
    /// is never touched.
    @Test func discardingGivesBackOnlyWholePagesOfASlot() throws {
        var buffer = ConnectionBuffers.allocator.buffer(capacity: 32 * 1024)
        buffer.writeRepeatingByte(0x5A, count: 32 * 1024)
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        try #require(page == 4_096, "this test assumes 4 KiB pages")
        try buffer.withUnsafeMutableReadableBytes { bytes in
            let base = try #require(bytes.baseAddress)
            #expect(ConnectionBuffers.slots(holding: base) != nil)
            // From the middle of the first page to the middle of the fifth: pages 2 to 4 go.
            let given = ConnectionBuffers.discardPages(of: UnsafeRawBufferPointer(rebasing: bytes[2_000..<18_000]))
            #expect(given == 3 * page)
            #expect(bytes[page - 1] == 0x5A)
            #expect(bytes[page] == 0 && bytes[4 * page - 1] == 0)
            #expect(bytes[4 * page] == 0x5A)
        }
        var elsewhere = ByteBufferAllocator().buffer(capacity: 32 * 1024)
        elsewhere.writeRepeatingByte(0x5A, count: 32 * 1024)
        elsewhere.withUnsafeReadableBytes { bytes in
            #expect(ConnectionBuffers.discardPages(of: bytes) == 0)
            #expect(bytes.allSatisfy { $0 == 0x5A })
        }
    }

    /// A slot that is not whole pages is never reserved (giving it back would take its
    /// neighbours' pages): every allocation of that size goes to the heap.
    @Test func slotsThatAreNotWholePagesAreNotReserved() {
        let slots = ConnectionBuffers.Slots(slotSize: 1_000, count: 4, keptWarm: 1)
        #expect(!slots.isReserved)
        #expect(slots.take() == nil)
    }

    /// Buffers through the allocator keep their bytes as they grow into a slot, out of one
    /// and past it, and as they are copied on write.
    @Test func buffersKeepTheirBytesAcrossSlotsAndTheHeap() {
        let allocator = ConnectionBuffers.allocator
        var buffer = allocator.buffer(capacity: 100)
        let bytes = (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        // 100 → … → 16 KiB (a slot) → 32 KiB (a slot) → 64 KiB, 128 KiB (the heap).
        for start in stride(from: 0, to: bytes.count, by: 1_000) {
            buffer.writeBytes(bytes[start..<min(start + 1_000, bytes.count)])
            #expect(buffer.readableBytesView.elementsEqual(bytes[0..<min(start + 1_000, bytes.count)]))
        }
        var slotted = allocator.buffer(capacity: 32 * 1024)
        slotted.writeBytes(bytes[0..<20_000])
        let copy = slotted
        slotted.setBytes([1, 2, 3], at: 0)  // copy on write: a second slot
        #expect(copy.readableBytesView.elementsEqual(bytes[0..<20_000]))
        #expect(Array(slotted.readableBytesView.prefix(3)) == [1, 2, 3])
        #expect(slotted.readableBytesView.dropFirst(3).elementsEqual(bytes[3..<20_000]))
    }

    /// Only NIOSSL's two buffer sizes come from slots.
    @Test func onlyTheTwoTLSBufferSizesTakeSlots() {
        let thirtyTwo = ConnectionBuffers.allocate(32 * 1024), sixteen = ConnectionBuffers.allocate(16 * 1024), other = ConnectionBuffers.allocate(8 * 1024)
        #expect(thirtyTwo.map { ConnectionBuffers.slots(holding: $0)?.slotSize } == 32 * 1024)
        #expect(sixteen.map { ConnectionBuffers.slots(holding: $0)?.slotSize } == 16 * 1024)
        #expect(other.map { ConnectionBuffers.slots(holding: $0) == nil } == true)
        for p in [thirtyTwo, sixteen, other].compactMap({ $0 }) { ConnectionBuffers.deallocate(p) }
    }
}
