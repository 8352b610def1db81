import Glibc
@_spi(CustomByteBufferAllocator) import NIOCore
import Synchronization

/// The byte buffers of agent connections, so an idle connection keeps resident only the pages
/// it has written.
///
/// Every TLS connection gets a 32 KiB plaintext read buffer and a 16 KiB outbound buffer from
/// NIOSSL when it starts, and keeps them for life; an idle agent writes a page or two of each.
/// From glibc's heap those buffers sit among the small allocations of every other connection
/// (and the handshake's, freed), so the pages they span are resident whether or not they were
/// written. Here buffers of exactly those two sizes (NIOSSL's, and any other buffer of the
/// channel that is that size: a socket read buffer, a copy on write) come from slots of their
/// own: a region of address space reserved once per size (inaccessible, so it counts against
/// no memory limit until a slot is first handed out and made writable), whose pages the kernel
/// provides on first write. A freed slot is reused first, warm ones before the others (an
/// upload's copy-on-write read buffers cost no system call); past ``keptWarm`` free warm slots
/// of a size, a freed slot's pages are given back to the system (a fleet disconnecting at once
/// does not stay resident). Every other size, either size once its region is full or could
/// not be reserved, and both on a system whose pages are larger than a slot, is glibc's
/// `malloc` as before.
///
/// The hooks are C functions (NIO's `CustomByteBufferAllocator` interface), so the slots are
/// process-wide.
enum ConnectionBuffers {
    /// The allocator of agent connections' channels (`ChannelOptions.allocator`).
    static let allocator = ByteBufferAllocator(
        allocate: { size in ConnectionBuffers.allocate(size) },
        reallocate: { pointer, old, new in ConnectionBuffers.reallocate(pointer, old: old, new: new) },
        deallocate: { pointer in ConnectionBuffers.deallocate(pointer) },
        copy: { destination, source, count in destination.copyMemory(from: source, byteCount: count) })

    /// Slots per size: more than the connections a server can hold (one file descriptor each).
    static let slotsPerSize = 65_536
    /// Free slots of a size whose pages stay resident, for reuse.
    static let keptWarm = 1_024

    /// NIOSSL's read buffer (two TLS records) and its outbound buffer (one record).
    static let sizes = [
        Slots(slotSize: 32 * 1024, count: slotsPerSize, keptWarm: keptWarm), Slots(slotSize: 16 * 1024, count: slotsPerSize, keptWarm: keptWarm),
    ]

    static func slots(sized size: Int) -> Slots? {
        sizes.first { $0.slotSize == size }
    }

    static func slots(holding pointer: UnsafeMutableRawPointer) -> Slots? {
        sizes.first { $0.holds(pointer) }
    }

    static func allocate(_ size: Int) -> UnsafeMutableRawPointer? {
        if let slot = slots(sized: size)?.take() { return slot }
        return malloc(size)
    }

    static func reallocate(_ pointer: UnsafeMutableRawPointer?, old: Int, new: Int) -> UnsafeMutableRawPointer? {
        guard let pointer else { return allocate(new) }
        if let from = slots(holding: pointer) {
            if new == from.slotSize { return pointer }
            guard let moved = allocate(new) else { return nil }
            moved.copyMemory(from: pointer, byteCount: min(old, new, from.slotSize))
            from.give(pointer)
            return moved
        }
        if let to = slots(sized: new), let moved = to.take() {
            moved.copyMemory(from: pointer, byteCount: min(old, new))
            free(pointer)
            return moved
        }
        return realloc(pointer, new)
    }

    /// Gives back to the system the whole pages within `bytes`, if they lie in a slot; memory
    /// outside the slots is left alone. For bytes of a live buffer that nobody will read again
    /// (a buffer whose indices were reset): its owner keeps the buffer, the pages read as
    /// zeros afterwards and the kernel provides them again on the next write. Returns the bytes
    /// given back.
    @discardableResult
    static func discardPages(of bytes: UnsafeRawBufferPointer) -> Int {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return 0 }
        let pointer = UnsafeMutableRawPointer(mutating: base)
        guard slots(holding: pointer) != nil else { return 0 }
        let page = UInt(sysconf(Int32(_SC_PAGESIZE)))
        guard page > 0 else { return 0 }
        let start = (UInt(bitPattern: base) + page - 1) / page * page
        let end = (UInt(bitPattern: base) + UInt(bytes.count)) / page * page
        guard end > start, let first = UnsafeMutableRawPointer(bitPattern: start) else { return 0 }
        return madvise(first, Int(end - start), MADV_DONTNEED) == 0 ? Int(end - start) : 0
    }

    static func deallocate(_ pointer: UnsafeMutableRawPointer) {
        if let from = slots(holding: pointer) {
            from.give(pointer)
        } else {
            free(pointer)
        }
    }

    /// A reserved region of `count` slots of `slotSize` bytes. Nothing is reserved (every
    /// allocation goes to `malloc`) if the system refuses the address space or its pages are
    /// larger than a slot.
    final class Slots: Sendable {
        let slotSize: Int
        let count: Int
        let keptWarm: Int
        /// The region's first address, 0 when nothing was reserved.
        private let base: UInt
        private let state = Mutex(State())

        private struct State {
            /// Slots never handed out (still inaccessible) start here.
            var fresh = 0
            /// Slots given back with their pages, most recent last (at most `keptWarm`).
            var warm: [Int32] = []
            /// Slots given back whose pages went back to the system.
            var cold: [Int32] = []
        }

        init(slotSize: Int, count: Int, keptWarm: Int) {
            self.slotSize = slotSize
            self.count = count
            self.keptWarm = keptWarm
            let length = slotSize * count
            // A slot must be whole pages: giving one back must not take its neighbours' pages.
            let page = sysconf(Int32(_SC_PAGESIZE))
            guard page > 0, slotSize % page == 0 else {
                base = 0
                return
            }
            let region = mmap(nil, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
            guard let region, region != UnsafeMutableRawPointer(bitPattern: -1) else {
                base = 0
                return
            }
            // One written page must not bring in a huge page.
            _ = madvise(region, length, MADV_NOHUGEPAGE)
            base = UInt(bitPattern: region)
        }

        deinit {
            if let region = UnsafeMutableRawPointer(bitPattern: base) { _ = munmap(region, slotSize * count) }
        }

        var isReserved: Bool { base != 0 }

        func holds(_ pointer: UnsafeMutableRawPointer) -> Bool {
            let address = UInt(bitPattern: pointer)
            return base != 0 && address >= base && address < base + UInt(slotSize * count)
        }

        /// A slot, or nil when every one is in use (or a fresh one cannot be made writable).
        func take() -> UnsafeMutableRawPointer? {
            guard base != 0 else { return nil }
            let picked: (index: Int, isFresh: Bool)? = state.withLock { s in
                if let reused = s.warm.popLast() ?? s.cold.popLast() { return (Int(reused), false) }
                guard s.fresh < count else { return nil }
                defer { s.fresh += 1 }
                return (s.fresh, true)
            }
            guard let (index, isFresh) = picked, let slot = UnsafeMutableRawPointer(bitPattern: base + UInt(index * slotSize)) else { return nil }
            // Made writable once, when first handed out; it stays so.
            // (Refused, the system is out of memory: the slot is left unused, never listed.)
            if isFresh, mprotect(slot, slotSize, PROT_READ | PROT_WRITE) != 0 { return nil }
            return slot
        }

        /// Gives a slot back: kept warm while fewer than `keptWarm` are, else its pages go back
        /// to the system first (before it is listed: once listed, another thread may write it).
        func give(_ pointer: UnsafeMutableRawPointer) {
            let index = Int32((UInt(bitPattern: pointer) - base) / UInt(slotSize))
            let keptWarm = state.withLock { s -> Bool in
                guard s.warm.count < self.keptWarm else { return false }
                s.warm.append(index)
                return true
            }
            guard !keptWarm else { return }
            _ = madvise(pointer, slotSize, MADV_DONTNEED)
            state.withLock { $0.cold.append(index) }
        }

        /// Slots handed out and not given back.
        var inUse: Int { state.withLock { $0.fresh - $0.warm.count - $0.cold.count } }
    }
}
