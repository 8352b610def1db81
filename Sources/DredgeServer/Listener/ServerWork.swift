import DredgePayload
import Foundation
import NIOPosix

/// Threads for the server's blocking work (configurable in `server.json`, `"threads": {…}`).
public struct WorkThreads: Codable, Sendable, Equatable {
    /// Connection control: authentication (an RSA verification), enrollment, heartbeats,
    /// presence, and making and recording pull commands (an RSA wrap and a signature). Default 2.
    public var control: Int
    /// Upload frames: chunk verification, durable writes, status updates and an upload's last
    /// steps. Several, since most of their time is waiting for fsync. Default 4.
    public var uploads: Int
    /// Unpacking uploads while they arrive (decrypted chunks inflated into files). Default 2.
    public var unpack: Int

    public init(control: Int = 2, uploads: Int = 4, unpack: Int = 2) {
        self.control = control
        self.uploads = uploads
        self.unpack = unpack
    }

    public static let `default` = WorkThreads()

    /// Keys left out of `server.json` keep their defaults; fewer than one thread is one.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = WorkThreads()
        control = max(1, try c.decodeIfPresent(Int.self, forKey: .control) ?? d.control)
        uploads = max(1, try c.decodeIfPresent(Int.self, forKey: .uploads) ?? d.uploads)
        unpack = max(1, try c.decodeIfPresent(Int.self, forKey: .unpack) ?? d.unpack)
    }
}

/// Where the agent listener's blocking work runs, so that neither NIO's event loops nor
/// Swift's cooperative pool ever wait on a disk, the database or RSA: the async side of a
/// connection only reads frames, hands each to one of these pools and writes the answers.
///
/// Each pool has a fixed number of threads, which bounds the work done at once; a connection
/// hands over one frame at a time and reads no further frames meanwhile, so a busy pool slows
/// the connections that use it (TCP pushes back on their senders) and nothing queues without
/// bound. Heartbeats and commands (`control`) never wait behind uploads (`uploads`, `unpack`).
final class ServerWork: Sendable {
    let control: NIOThreadPool
    let uploads: NIOThreadPool
    let unpack: NIOThreadPool

    init(_ threads: WorkThreads) {
        control = NIOThreadPool(numberOfThreads: max(1, threads.control))
        uploads = NIOThreadPool(numberOfThreads: max(1, threads.uploads))
        unpack = NIOThreadPool(numberOfThreads: max(1, threads.unpack))
        for pool in [control, uploads, unpack] { pool.start() }
    }

    /// The executor of ``PayloadStream``: the unpack pool (never the threads that wait for it).
    var unpacking: PayloadStream.Schedule {
        { [unpack] work in unpack.submit { state in work(state == .active) } }
    }

    func shutdown() async {
        for pool in [control, uploads, unpack] {
            do { try await pool.shutdownGracefully() } catch {}  // already stopped: nothing left to wait for
        }
    }
}
