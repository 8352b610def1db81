// The libFuzzer target for the frame decoder and message parsing (docs/fuzzing.md).
//
// Built normally it is a corpus replayer: `dredge-fuzz-frames FILE|DIR…` runs every input once
// (the tests use it to replay the seed corpus). Built with `-sanitize=fuzzer -DFUZZING`
// (scripts/fuzz.sh) libFuzzer drives `LLVMFuzzerTestOneInput`.
import DredgeWire
import Foundation
import NIOCore

/// One input: split into frames as a receiver would, in one piece and a byte at a time, and
/// require the same outcome; every frame that decodes must re-encode and decode to itself.
func fuzzOne(_ input: UnsafeRawBufferPointer) {
    let whole = decodeAll(ByteBuffer(bytes: input), pieceSize: nil)
    let trickled = decodeAll(ByteBuffer(bytes: input), pieceSize: 1 + (input.first.map { Int($0) % 7 } ?? 0))
    precondition(whole.frames == trickled.frames, "decoding depends on how the bytes arrive")
    precondition(whole.error == trickled.error, "the error depends on how the bytes arrive")
    for frame in whole.frames {
        guard let bytes = try? FrameEncoder.bytes(of: frame) else { continue }
        var buffer = ByteBuffer(bytes: bytes)
        let again = try? FrameDecoder.decodeFrame(from: &buffer)
        precondition(again == frame, "a decoded frame does not survive re-encoding")
    }
}

struct Outcome: Equatable {
    var frames: [WireFrame] = []
    var error: WireErrorCode?
}

func decodeAll(_ input: ByteBuffer, pieceSize: Int?) -> Outcome {
    var outcome = Outcome()
    var pending = ByteBuffer()
    var source = input
    while source.readableBytes > 0 {
        let n = min(pieceSize ?? source.readableBytes, source.readableBytes)
        var slice = source.readSlice(length: n)!
        pending.writeBuffer(&slice)
        do {
            while let frame = try FrameDecoder.decodeFrame(from: &pending) { outcome.frames.append(frame) }
        } catch let error as WireProtocolError {
            outcome.error = error.code
            return outcome
        } catch {
            preconditionFailure("untyped error \(error)")
        }
    }
    return outcome
}

#if FUZZING
@_cdecl("LLVMFuzzerTestOneInput")
public func LLVMFuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzOne(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}

typealias FuzzerCallback = @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt

@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: FuzzerCallback) -> CInt

/// SwiftPM links an executable's entry point under this name; hand control to libFuzzer.
@_cdecl("dredge_fuzz_frames_main")
public func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv, LLVMFuzzerTestOneInput)
}
#else
@main
struct ReplayCorpus {
    static func main() throws {
        var count = 0
        for argument in CommandLine.arguments.dropFirst() {
            var isDirectory: ObjCBool = false
            FileManager.default.fileExists(atPath: argument, isDirectory: &isDirectory)
            let files = isDirectory.boolValue
                ? try FileManager.default.contentsOfDirectory(atPath: argument).sorted().map { argument + "/" + $0 } : [argument]
            for file in files {
                let data = try Data(contentsOf: URL(fileURLWithPath: file))
                data.withUnsafeBytes { fuzzOne($0) }
                count += 1
            }
        }
        print("replayed \(count) inputs")
    }
}
#endif
