@testable import DredgeServer
import DredgeWire
import Glibc
import NIOCore
import NIOEmbedded
import Testing

/// What reaches the next handler: each read's bytes and each end of a read, in order.
private final class Recorder: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    /// Bytes as their count and a hash (a failure does not print kilobytes).
    struct Bytes: Hashable, CustomStringConvertible {
        let count: Int, hash: Int
        init(_ bytes: some Sequence<UInt8>) {
            let all = Array(bytes)
            count = all.count
            hash = all.hashValue
        }
        var description: String { "\(count) bytes" }
    }
    enum Event: Equatable, CustomStringConvertible {
        case read(Bytes)
        case complete
        /// The pacer's ``PreAuthenticationRecordPacer/RecordComing``.
        case coming
        static func read(_ bytes: [UInt8]) -> Event { .read(Bytes(bytes)) }
        var description: String {
            switch self {
            case .read(let bytes): "read(\(bytes))"
            case .complete: "complete"
            case .coming: "coming"
            }
        }
    }
    var events: [Event] = []
    /// Each read's buffer: whether its capacity was sized for what it holds (``fitted``).
    var fittedReads: [Bool] = []
    /// Where each read's bytes lay.
    var storages: [UInt] = []
    var reads: [Bytes] { events.compactMap { if case .read(let bytes) = $0 { bytes } else { nil } } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        events.append(.read(Bytes(buffer.readableBytesView)))
        fittedReads.append(fitted(buffer.capacity, buffer.readableBytes))
        storages.append(buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) })
    }

    func channelReadComplete(context: ChannelHandlerContext) { events.append(.complete) }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is PreAuthenticationRecordPacer.RecordComing { events.append(.coming) }
    }
}

private func buffer(_ bytes: some Sequence<UInt8>) -> ByteBuffer { ByteBuffer(bytes: Array(bytes)) }

/// A buffer made for `count` bytes: NIO rounds a capacity up to a power of two, so under twice
/// that. One grown by doubling as bytes came, or one of TLS's own (32 KiB), is not.
private func fitted(_ capacity: Int?, _ count: Int) -> Bool {
    guard let capacity else { return false }
    return capacity >= count && capacity < 2 * count
}

/// A TLS record of `length` body bytes (application data, TLS 1.2 version).
private func record(_ length: Int, fill: UInt8 = 0x42) -> [UInt8] {
    [23, 3, 3, UInt8(length >> 8), UInt8(length & 0xFF)] + [UInt8](repeating: fill, count: length)
}

@Suite struct PreAuthenticationRecordPacerTests {
    fileprivate func channel() throws -> (EmbeddedChannel, PreAuthenticationRecordPacer, Recorder, FrameSizeLimit) {
        let limit = FrameSizeLimit(WireLimits.maxPreAuthFrameBytes)
        let pacer = PreAuthenticationRecordPacer(limit: limit)
        let recorder = Recorder()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(pacer)
        try channel.pipeline.syncOperations.addHandler(recorder)
        return (channel, pacer, recorder, limit)
    }

    @Test func recordsReadTogetherReachTLSOneAtATimeEachWithTheEndOfARead() throws {
        let (channel, _, recorder, _) = try channel()
        let a = record(16_384), b = record(3, fill: 7)
        try channel.writeInbound(buffer(a + b))
        channel.pipeline.fireChannelReadComplete()
        #expect(recorder.events == [.coming, .read(a), .complete, .coming, .read(b), .complete])
        #expect(recorder.fittedReads == [true, true])
    }

    @Test func aRecordTrickledInIsHeldInABufferOfItsOwnSizeUntilWhole() throws {
        let (channel, pacer, recorder, _) = try channel()
        let whole = record(16_000)
        for byte in whole.prefix(5) { try channel.writeInbound(buffer([byte])) }
        #expect(fitted(pacer.heldCapacity, whole.count))
        var offset = 5
        while offset < whole.count {
            #expect(recorder.events.isEmpty)
            let end = min(offset + 1_000, whole.count)
            try channel.writeInbound(buffer(whole[offset..<end]))
            channel.pipeline.fireChannelReadComplete()
            offset = end
        }
        #expect(recorder.events == [.coming, .read(whole), .complete])
        #expect(recorder.fittedReads == [true])
        #expect(pacer.heldCapacity == nil)
    }

    @Test func aRecordLongerThanTLSAcceptsIsPassedOnAtOnceForTLSToRefuse() throws {
        let (channel, _, recorder, _) = try channel()
        let length = PreAuthenticationRecordPacer.maxRecordBodyBytes + 1
        let header: [UInt8] = [23, 3, 3, UInt8(length >> 8), UInt8(length & 0xFF)]
        try channel.writeInbound(buffer(header + [1, 2, 3]))
        #expect(recorder.reads == [.init(header), .init([1, 2, 3])])
        try channel.writeInbound(buffer([4, 5]))
        #expect(recorder.reads.last == .init([4, 5]))
    }

    @Test func whatIsNotATLSRecordIsPassedOnAtOnceForTLSToRefuse() throws {
        for bytes in [Array("GET / HTTP/1.1\r\n".utf8), [25, 3, 3, 0, 10, 1], [22, 2, 0, 0, 10, 1]] {
            let (channel, _, recorder, _) = try channel()
            try channel.writeInbound(buffer(bytes))
            #expect(recorder.reads == [.init(bytes.prefix(5)), .init(bytes.dropFirst(5))], "\(bytes)")
        }
    }

    @Test func readsAreSmallUntilAuthenticationThenEverythingPassesAsItCame() throws {
        let (channel, _, recorder, limit) = try channel()
        let before = try channel.getOption(ChannelOptions.recvAllocator).wait()
        #expect((before as? FixedSizeRecvByteBufferAllocator)?.capacity == PreAuthenticationRecordPacer.readBytes)
        let partial = record(100)
        try channel.writeInbound(buffer(partial.prefix(50)))
        #expect(recorder.events.isEmpty)

        limit.set(WireLimits.maxFrameBytes)
        let rest = Array(partial.dropFirst(50)) + record(30_000)  // no longer cut into records
        try channel.writeInbound(buffer(rest))
        channel.pipeline.fireChannelReadComplete()
        #expect(recorder.reads == [.init(partial.prefix(50)), .init(rest)])
        #expect(recorder.events.last == .complete)
        #expect(try channel.getOption(ChannelOptions.recvAllocator).wait() is AdaptiveRecvByteBufferAllocator)
    }
}

@Suite struct PreAuthenticationGathererTests {
    fileprivate func channel(decoding: Bool) throws -> (EmbeddedChannel, PreAuthenticationGatherer, Recorder, FrameSizeLimit) {
        let limit = FrameSizeLimit(WireLimits.maxPreAuthFrameBytes)
        let gatherer = PreAuthenticationGatherer(limit: limit)
        let recorder = Recorder()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(gatherer)
        if decoding {
            try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(limit: limit)))
        } else {
            try channel.pipeline.syncOperations.addHandler(recorder)
        }
        return (channel, gatherer, recorder, limit)
    }

    /// A length prefix and `body` bytes.
    func frame(announcing length: Int, body: Int) -> [UInt8] {
        [UInt8(length >> 24), UInt8((length >> 16) & 0xFF), UInt8((length >> 8) & 0xFF), UInt8(length & 0xFF)] + [UInt8](repeating: 0x0A, count: body)
    }

    @Test func aPartialFrameIsHeldInABufferOfItsOwnSizeAndPassedOnWhole() throws {
        let (channel, gatherer, recorder, _) = try channel(decoding: false)
        let largest = WireLimits.maxPreAuthFrameBytes
        let whole = frame(announcing: largest, body: largest)
        try channel.writeInbound(buffer(whole.prefix(2)))
        #expect(gatherer.heldCapacity == 4)
        try channel.writeInbound(buffer(whole[2..<16_384]))
        #expect(fitted(gatherer.heldCapacity, 4 + largest))
        #expect(recorder.reads.isEmpty)
        // The frame's end and the start of the next in one read.
        let next = frame(announcing: 10, body: 3)
        try channel.writeInbound(buffer(whole[16_384...] + next))
        #expect(recorder.reads == [.init(whole)])
        #expect(recorder.fittedReads == [true])
        #expect(fitted(gatherer.heldCapacity, 14))
    }

    @Test func aWholeFrameIsPassedOnWhereItLiesAndPartOfOneIsCopiedOutBeforeTLSWritesAgain() throws {
        let (channel, gatherer, recorder, _) = try channel(decoding: false)
        let a = frame(announcing: 100, body: 100), b = frame(announcing: 1_000, body: 1_000)
        // As TLS hands its bytes on: in its buffer, much larger than what it holds.
        var first = ByteBufferAllocator().buffer(capacity: 32_768)
        first.writeBytes(a + b.prefix(300))
        let storage = first.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
        try channel.writeInbound(first)
        #expect(recorder.reads == [.init(a)])
        #expect(recorder.storages.first == storage, "a whole frame copied")
        #expect(gatherer.heldCapacity == 32_768, "part of a frame copied before TLS writes again")
        // TLS is about to write to its buffer: what lies there is taken out.
        channel.pipeline.fireUserInboundEventTriggered(PreAuthenticationRecordPacer.RecordComing())
        #expect(fitted(gatherer.heldCapacity, b.count))
        try channel.writeInbound(buffer(b.dropFirst(300)))
        #expect(recorder.reads == [.init(a), .init(b)])
        #expect(recorder.fittedReads == [true, true])
        #expect(recorder.events.contains(.coming) == false, "the gatherer's own event went on down the pipeline")
    }

    @Test func tlsPagesAreGivenBackOnceDoneWithAndNotWhileAFrameLiesThere() throws {
        try #require(sysconf(Int32(_SC_PAGESIZE)) == 4_096, "this test assumes 4 KiB pages")
        let (channel, gatherer, recorder, _) = try channel(decoding: false)
        let a = frame(announcing: 12_000, body: 12_000), b = frame(announcing: 9_000, body: 9_000)
        // TLS's buffer, from the agent connections' allocator: whole pages of it can be given back.
        var tls = ConnectionBuffers.allocator.buffer(capacity: 32_768)
        tls.writeBytes(a + b.prefix(8_000))
        let view = tls  // what TLS keeps (its indices reset, as NIOSSL does)
        try channel.writeInbound(tls)
        #expect(recorder.reads == [.init(a)])
        view.withUnsafeReadableBytes { bytes in
            #expect(bytes[4_096..<8_192].allSatisfy { $0 == 0 }, "the whole frame's pages not given back")
            #expect(Array(bytes[12_004..<20_004]) == Array(b.prefix(8_000)), "the frame lying there lost its bytes")
        }
        #expect(gatherer.heldCapacity == 32_768)
        channel.pipeline.fireUserInboundEventTriggered(PreAuthenticationRecordPacer.RecordComing())
        view.withUnsafeReadableBytes { bytes in
            #expect(bytes[12_288..<16_384].allSatisfy { $0 == 0 }, "copied out, but its pages not given back")
        }
        try channel.writeInbound(buffer(b.dropFirst(8_000)))
        #expect(recorder.reads == [.init(a), .init(b)])
    }

    @Test func partOfAFrameLeftInPlaceIsStillGatheredWhenMoreComesUnannounced() throws {
        let (channel, _, _, _) = try channel(decoding: true)
        let sent = WireFrame.with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1; $0.software = String(repeating: "s", count: 1_000) } }
        let bytes = try FrameEncoder.bytes(of: sent)
        var first = ByteBufferAllocator().buffer(capacity: 32_768)
        first.writeBytes(bytes.prefix(500))
        try channel.writeInbound(first)
        try channel.writeInbound(buffer(bytes.dropFirst(500)))
        #expect(try channel.readInbound(as: WireFrame.self) == sent)
    }

    @Test func framesSplitAnyhowAreDecodedAsSent() throws {
        let (channel, _, _, _) = try channel(decoding: true)
        let sent: [WireFrame] = [
            .with { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1; $0.software = String(repeating: "s", count: 5_000) } },
            .with { $0.authResponse = .with { $0.agentID = String(repeating: "a", count: 32); $0.signature = .init(repeating: 9, count: 512) } },
        ]
        let bytes = try sent.flatMap { try FrameEncoder.bytes(of: $0) }
        var offset = 0, step = 1
        while offset < bytes.count {
            let end = min(offset + step, bytes.count)
            try channel.writeInbound(buffer(bytes[offset..<end]))
            offset = end
            step = step * 3 % 1_999 + 1
        }
        #expect(try channel.readInbound(as: WireFrame.self) == sent[0])
        #expect(try channel.readInbound(as: WireFrame.self) == sent[1])
        #expect(try channel.readInbound(as: WireFrame.self) == nil)
    }

    @Test func aLengthTheDecoderRefusesReachesItAtOnce() throws {
        for (length, code) in [(0, WireErrorCode.errorMalformedFrame), (WireLimits.maxPreAuthFrameBytes + 1, .errorFrameTooLarge)] {
            let (channel, _, _, _) = try channel(decoding: true)
            let error = #expect(throws: WireProtocolError.self) { try channel.writeInbound(buffer(frame(announcing: length, body: 2))) }
            #expect(error?.code == code)
        }
    }

    @Test func aFrameCutShortByTheEndOfTheConnectionReachesTheDecoder() throws {
        let (channel, _, _, _) = try channel(decoding: true)
        try channel.writeInbound(buffer(frame(announcing: 1_000, body: 10)))
        #expect(throws: WireProtocolError.self) { _ = try channel.finish() }
    }

    @Test func afterAuthenticationBytesPassAsTheyCame() throws {
        let (channel, _, recorder, limit) = try channel(decoding: false)
        let held = frame(announcing: 1_000, body: 10)
        try channel.writeInbound(buffer(held))
        limit.set(WireLimits.maxFrameBytes)
        try channel.writeInbound(buffer([1, 2, 3]))
        #expect(recorder.reads == [.init(held), .init([1, 2, 3])])
    }
}
