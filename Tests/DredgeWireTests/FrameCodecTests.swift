import DredgeTestSupport
import DredgeWire
import Foundation
import NIOCore
import NIOEmbedded
import NIOTestUtils
import Testing

/// One frame of every message type, with fields set, as the tests and the vectors use them.
enum SampleFrames {
    static var all: [(String, WireFrame)] {
        var frames: [(String, WireFrame)] = []
        func add(_ name: String, _ build: (inout WireFrame) -> Void) {
            var f = WireFrame()
            build(&f)
            frames.append((name, f))
        }
        var host = WireHostInfo()
        host.hostname = "kitchen-oven-0042"
        host.os = "Debian 12"
        host.app = "oven-control"
        host.appVersion = "2.4.1"
        host.extra = ["region": "eu-west"]
        add("hello") { $0.hello = .with { $0.minVersion = 1; $0.maxVersion = 1; $0.software = "dredge-agent/0.1.0" } }
        add("hello_ack") { $0.helloAck = .with { $0.version = 1; $0.software = "dredge-server/0.1.0"; $0.challenge = Data(repeating: 0xC7, count: 32) } }
        add("enroll_request") { $0.enrollRequest = .with { $0.token = "enr_0123456789abcdef"; $0.publicKey = Data([0x30, 0x82, 0x01, 0x22]); $0.host = host } }
        add("enroll_response") { $0.enrollResponse = .with { $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"; $0.serverSigningKey = Data(repeating: 0x11, count: 32); $0.serverEncryptionKey = Data([0x30, 0x82]) } }
        add("auth_response") { $0.authResponse = .with { $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"; $0.signature = Data(repeating: 0x5A, count: 384); $0.host = host } }
        add("auth_result") { $0.authResult = .with { $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"; $0.heartbeatIntervalS = 30; $0.window = 8; $0.maxChunkBytes = 1_048_576 } }
        add("heartbeat") {
            $0.heartbeat = .with {
                $0.seq = 42
                $0.activeUids = ["u-1001", "u-1002"]
                $0.stats = .with { $0.records = 60_002; $0.oldestUs = 1_795_000_000_000_000; $0.newestUs = 1_795_340_400_000_042; $0.bytesOnDisk = 18_661_376; $0.dropped = 0 }
            }
        }
        add("heartbeat_ack") { $0.heartbeatAck = .with { $0.seq = 42 } }
        add("pull_command") {
            $0.pullCommand = .with {
                $0.commandID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"
                $0.target = .with { $0.uid = "u-1002" }
                $0.filter = .with { $0.sinceUs = 1_795_100_000_000_000; $0.untilUs = 1_795_340_400_000_000; $0.uid = "u-1002"; $0.types = ["network"]; $0.levels = [.warning, .error]; $0.text = "timeout" }
                $0.issuedAtUs = 1_795_340_400_000_000
                $0.expiresAtUs = 1_795_344_000_000_000
                $0.wrappedKey = Data(repeating: 0x77, count: 384)
                $0.signature = Data(repeating: 0x66, count: 64)
            }
        }
        add("command_accepted") { $0.commandAccepted = .with { $0.commandID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e" } }
        add("command_rejected") { $0.commandRejected = .with { $0.commandID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.reason = .rejectExpired; $0.detail = "expired at 2026-11-22T10:40:00Z" } }
        add("upload_begin") {
            $0.uploadBegin = .with {
                $0.header = .with {
                    $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.kind = .pull; $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"
                    $0.noncePrefix = Data([1, 2, 3, 4, 5, 6, 7]); $0.chunkSize = 262_144; $0.plaintextSize = 600_000; $0.chunkCount = 3
                    $0.empty = false; $0.createdAtUs = 1_795_340_401_000_000
                }
            }
        }
        add("upload_ready") { $0.uploadReady = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.received = Data([0b0000_0101]) } }
        add("upload_chunk") { $0.uploadChunk = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.index = 1; $0.ciphertext = Data(repeating: 0xAB, count: 48) } }
        add("chunk_ack") { $0.chunkAck = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.index = 1 } }
        add("upload_status_query") { $0.uploadStatusQuery = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e" } }
        add("upload_status") { $0.uploadStatus = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.state = .receiving; $0.received = Data([0b0000_0011]) } }
        add("upload_complete") { $0.uploadComplete = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e" } }
        add("upload_result") { $0.uploadResult = .with { $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e"; $0.ok = true; $0.files = 3; $0.records = 1_546 } }
        add("error") { $0.error = .with { $0.code = .errorChunkAuthFailed; $0.detail = "chunk 2 does not authenticate"; $0.fatal = false; $0.uploadID = "9b2f4c6d8e0a1b3c5d7e9f0a2b4c6d8e" } }
        add("goodbye") { $0.goodbye = .with { $0.reason = "server shutting down" } }
        // The same message with the planned-restart fields (Protocol § 6): 60 s, retry every 2 s.
        add("goodbye_planned_restart") { $0.goodbye = .with { $0.reason = "server shutting down"; $0.backWithinMs = 60_000; $0.retryEveryMs = 2_000 } }
        // Live tail (Protocol § 20), with the capability `live-tail`.
        let tail = "5d1e7a3c9b0f2e4d6c8a1b3e5f7d9c0a"
        add("tail_command") {
            $0.tailCommand = .with {
                $0.tailID = tail
                $0.target = .with { $0.uid = "u-1002"; $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f" }
                $0.filter = .with { $0.levels = [.warning, .error]; $0.text = "timeout" }
                $0.issuedAtUs = 1_795_340_400_000_000
                $0.expiresAtUs = 1_795_341_300_000_000
                $0.maxRecordsPerS = 200
                $0.maxBytesPerS = 262_144
                $0.verbose = true
                $0.wrappedKey = Data(repeating: 0x77, count: 384)
                $0.signature = Data(repeating: 0x66, count: 64)
            }
        }
        add("tail_accepted") { $0.tailAccepted = .with { $0.tailID = tail; $0.startCursor = 60_000 } }
        add("tail_batch") { $0.tailBatch = .with { $0.tailID = tail; $0.seq = 3; $0.dropped = 2; $0.cursor = 60_517; $0.nonce = Data(repeating: 0xE0, count: 12); $0.ciphertext = Data(repeating: 0xAB, count: 48) } }
        add("tail_ack") { $0.tailAck = .with { $0.tailID = tail; $0.seq = 3; $0.cursor = 60_517 } }
        add("tail_stop") { $0.tailStop = .with { $0.tailID = tail; $0.reason = "stopped by alice" } }
        add("trigger_set") {
            $0.triggerSet = .with {
                $0.agentID = "4f1c2a9e0b7d3c5a6e8f9a1b2c3d4e5f"
                $0.version = 7
                $0.issuedAtUs = 1_795_340_400_000_000
                $0.triggers = [
                    .with {
                        $0.triggerID = "7a0b1c2d3e4f50617283940a1b2c3d4e"
                        $0.name = "payment declined"
                        $0.match = .with { $0.levels = [.error]; $0.types = ["business"]; $0.text = "payment declined" }
                        $0.beforeS = 300
                        $0.afterS = 60
                        $0.maxPerDeviceDay = 3
                        $0.expiresAtUs = 1_795_945_200_000_000
                    }
                ]
                $0.signature = Data(repeating: 0x53, count: 64)
            }
        }
        add("trigger_set_ack") { $0.triggerSetAck = .with { $0.version = 7; $0.issuedAtUs = 1_795_340_400_000_000 } }
        return frames
    }
}

@Suite struct FrameCodecTests {
    @Test func everyMessageTypeRoundTripsThroughTheCodec() throws {
        let frames = SampleFrames.all.map(\.1)
        #expect(frames.count == 29)
        // Every body case is covered (Goodbye twice: with and without its planned-restart fields).
        #expect(Set(frames.map { String(describing: $0.body!).prefix(while: { $0 != "(" }) }).count == 28)
        let pairs = try frames.map { frame -> (ByteBuffer, [WireFrame]) in
            (ByteBuffer(bytes: try FrameEncoder.bytes(of: frame)), [frame])
        }
        // Byte at a time, in odd batches, shuffled, and all at once: the NIO verifier.
        try ByteToMessageDecoderVerifier.verifyDecoder(inputOutputPairs: pairs) { FrameDecoder() }
    }

    @Test func framesAreLengthPrefixedProtobuf() throws {
        let frame = WireFrame.with { $0.heartbeatAck = .with { $0.seq = 300 } }
        let bytes = try FrameEncoder.bytes(of: frame)
        // body: field 8 (heartbeat_ack), length 3: field 1 varint 300 (0xAC 0x02)
        #expect(bytes == [0, 0, 0, 5, 0x42, 0x03, 0x08, 0xAC, 0x02])
    }

    @Test func anOversizeLengthIsRejectedBeforeTheBodyArrives() throws {
        var buffer = ByteBuffer()
        buffer.writeInteger(UInt32(WireLimits.maxFrameBytes + 1))
        let error = #expect(throws: WireProtocolError.self) { try FrameDecoder.decodeFrame(from: &buffer) }
        #expect(error?.code == .errorFrameTooLarge)
        // An HTTP request on the port reads as a huge length: rejected at once.
        var http = ByteBuffer(string: "GET / HTTP/1.1\r\n")
        #expect(throws: WireProtocolError.self) { try FrameDecoder.decodeFrame(from: &http) }
        // An HTTP answer (an agent given the admin API's address) says so in words (#50).
        var answer = ByteBuffer(string: "HTTP/1.1 400 Bad Request\r\n")
        let told = #expect(throws: WireProtocolError.self) { try FrameDecoder.decodeFrame(from: &answer) }
        #expect(told?.message.contains("the server answered in HTTP") == true && told?.message.contains("agent port") == true, "\(String(describing: told))")
    }

    @Test func malformedInputIsATypedFatalError() throws {
        let cases: [[UInt8]] = [
            [0, 0, 0, 0],  // empty frame
            [0, 0, 0, 3, 0xFF, 0xFF, 0xFF],  // not protobuf
            [0, 0, 0, 2, 0xF8, 0x07],  // field 127: a frame with no known body
            [0, 0, 0, 4, 0x0A, 0x05, 0x08, 0x01],  // nested message truncated
        ]
        for bytes in cases {
            var buffer = ByteBuffer(bytes: bytes)
            let error = #expect(throws: WireProtocolError.self, "\(bytes)") { try FrameDecoder.decodeFrame(from: &buffer) }
            #expect(error?.code == .errorMalformedFrame, "\(bytes)")
            #expect(error?.fatal == true)
        }
    }

    @Test func aConnectionClosedInsideAFrameIsReported() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FrameDecoder()))
        var buffer = ByteBuffer()
        buffer.writeInteger(UInt32(10))
        buffer.writeBytes([1, 2, 3])
        try channel.writeInbound(buffer)
        #expect(throws: WireProtocolError.self) { _ = try channel.finish() }
    }

    @Test func theEncoderRefusesFramesOverTheLimit() throws {
        let frame = WireFrame.with { $0.uploadChunk = .with { $0.ciphertext = Data(count: WireLimits.maxFrameBytes) } }
        let error = #expect(throws: WireProtocolError.self) { try FrameEncoder.bytes(of: frame) }
        #expect(error?.code == .errorFrameTooLarge)
        // The largest chunk the protocol allows does fit.
        let largest = WireFrame.with {
            $0.uploadChunk = .with { $0.uploadID = String(repeating: "f", count: WireLimits.maxIDBytes); $0.index = UInt32.max; $0.ciphertext = Data(count: WireLimits.maxChunkBytes + WireLimits.tagBytes) }
        }
        #expect(try FrameEncoder.bytes(of: largest).count <= WireLimits.maxFrameBytes + 4)
    }

    @Test func encoderAndDecoderWorkInAPipeline() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(MessageToByteHandler(FrameEncoder()))
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
        for (_, frame) in SampleFrames.all { try channel.writeOutbound(frame) }
        while let bytes = try channel.readOutbound(as: ByteBuffer.self) { try channel.writeInbound(bytes) }
        var received: [WireFrame] = []
        while let frame = try channel.readInbound(as: WireFrame.self) { received.append(frame) }
        #expect(received == SampleFrames.all.map(\.1))
        _ = try channel.finish()
    }
}

@Suite struct CanonicalEncodingTests {
    @Test func commandSigningInputIgnoresListOrderButNotValues() {
        var a = SampleFrames.all.first { $0.0 == "pull_command" }!.1.pullCommand
        var b = a
        b.filter.types = ["player", "network"]
        a.filter.types = ["network", "player"]
        b.filter.levels = [.error, .warning]
        #expect(SigningInput.pullCommand(a) == SigningInput.pullCommand(b))
        // The signature itself is not signed.
        b.signature = Data([1])
        #expect(SigningInput.pullCommand(a) == SigningInput.pullCommand(b))
        var mutations: [(inout WirePullCommand) -> Void] = [
            { $0.commandID += "0" }, { $0.target.uid = "u-9" }, { $0.target.agentID = "x" }, { $0.filter.sinceUs += 1 },
            { $0.filter.clearSinceUs() }, { $0.filter.untilUs -= 1 }, { $0.filter.uid = "other" }, { $0.filter.clearUid() },
            { $0.filter.types.append("business") }, { $0.filter.levels = [.error] }, { $0.filter.text = "TIMEOUT" },
            { $0.filter.clearText() }, { $0.issuedAtUs += 1 }, { $0.expiresAtUs += 1 }, { $0.wrappedKey[0] ^= 1 },
        ]
        // An empty optional text and an absent one differ.
        mutations.append { $0.filter.text = "" }
        for (i, mutate) in mutations.enumerated() {
            var c = a
            mutate(&c)
            #expect(SigningInput.pullCommand(c) != SigningInput.pullCommand(a), "mutation \(i)")
        }
    }

    @Test func canonicalBytesAreExactlyAsSpecified() {
        var w = CanonicalWriter(domain: "t")
        w.string("ab")
        w.u32(1)
        w.i64(-2)
        w.bool(true)
        w.optional(Int64?.none) { $0.i64($1) }
        w.optional(Int64?.some(3)) { $0.i64($1) }
        w.list(["x"]) { $0.string($1) }
        #expect(w.bytes == [0x74, 0x00, 0, 0, 0, 2, 0x61, 0x62, 0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0x78])
    }
}

@Suite struct FrameVectorTests {
    /// `Protocol/vectors/frames.json`: one frame of every message type, exact bytes (and Goodbye's
    /// planned-restart fields, added later within version 1).
    @Test func framesMatchTheCommittedVectors() throws {
        var frames: [[String: Any]] = []
        for (name, frame) in SampleFrames.all {
            let bytes = try FrameEncoder.bytes(of: frame)
            // The body's field number: the first key of the Frame message.
            let fieldNumber = Int(bytes[4] >> 3)
            frames.append(["name": name, "body_field": fieldNumber, "hex": bytes.map { String(format: "%02x", $0) }.joined()])
            var buffer = ByteBuffer(bytes: bytes)
            #expect(try FrameDecoder.decodeFrame(from: &buffer) == frame)
        }
        let (committed, produced) = try Vectors.check("frames.json", [
            "description": "One frame of every message type (Goodbye twice: with and without its planned-restart fields): 4-byte big-endian length, then the serialized dredge.v1.Frame. body_field is the Frame field number of the message.",
            "frames": frames,
        ])
        #expect(committed == produced)
    }
}

@Suite struct FuzzCorpusTests {
    /// The fuzz target's own checks, over the committed seed corpus (scripts/fuzz.sh runs the
    /// real fuzzer on top of it).
    @Test func theSeedCorpusReplaysCleanly() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: builtProduct("dredge-fuzz-frames"))
        process.arguments = [Vectors.repositoryRoot.appendingPathComponent("Tests/Fuzz/corpus/frames").path]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(text.contains("replayed 28 inputs"))
    }
}
