import CDredgeSystem
import DredgePayload
import DredgeReception
import Dispatch
import Foundation
import NIOPosix
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

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
    /// The `nice` value of the `uploads` and `unpack` threads (Linux: per thread), 0 to 19:
    /// under load the scheduler gives the event loops, heartbeats and commands the CPU first.
    /// Default 10. Without effect while ``bulkIdle`` holds.
    public var bulkNice: Int
    /// The `uploads` and `unpack` threads run under Linux's `SCHED_IDLE` policy: any other
    /// thread of the machine that wakes (an event loop with a heartbeat to answer) takes their
    /// CPU at once, where a niced thread keeps it until its time slice ends. They still get
    /// whatever CPU is left over, so uploads go at full speed on an otherwise idle server.
    /// Default true.
    public var bulkIdle: Bool

    public init(control: Int = 2, uploads: Int = 4, unpack: Int = 2, bulkNice: Int = 10, bulkIdle: Bool = true) {
        self.control = control
        self.uploads = uploads
        self.unpack = unpack
        self.bulkNice = bulkNice
        self.bulkIdle = bulkIdle
    }

    public static let `default` = WorkThreads()

    /// Keys left out of `server.json` keep their defaults; fewer than one thread is one.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = WorkThreads()
        control = max(1, try c.decodeIfPresent(Int.self, forKey: .control) ?? d.control)
        uploads = max(1, try c.decodeIfPresent(Int.self, forKey: .uploads) ?? d.uploads)
        unpack = max(1, try c.decodeIfPresent(Int.self, forKey: .unpack) ?? d.unpack)
        bulkNice = min(19, max(0, try c.decodeIfPresent(Int.self, forKey: .bulkNice) ?? d.bulkNice))
        bulkIdle = try c.decodeIfPresent(Bool.self, forKey: .bulkIdle) ?? d.bulkIdle
    }
}

/// Where the agent listener's blocking work runs, so that neither NIO's event loops nor
/// Swift's cooperative pool ever wait on a disk, the database or RSA: the async side of a
/// connection only reads frames, hands each to one of these pools and writes the answers.
///
/// Each pool has a fixed number of threads, which bounds the work done at once; a connection
/// hands over one frame at a time and stops reading while a few wait (``ConnectionDriver``),
/// so a busy pool slows the connections that use it (TCP pushes back on their senders) and
/// nothing queues without bound. Heartbeats and commands (`control`) never wait behind uploads (`uploads`, `unpack`).
final class ServerWork: Sendable {
    let control: NIOThreadPool
    let uploads: NIOThreadPool
    let unpack: NIOThreadPool
    /// Why the `SCHED_IDLE` policy asked for (``WorkThreads/bulkIdle``) could not be set on a
    /// bulk thread (that thread then runs at ``WorkThreads/bulkNice``); nil when it was, or
    /// was not asked for.
    let idlePolicyRefused: String?

    init(_ threads: WorkThreads) {
        control = NIOThreadPool(numberOfThreads: max(1, threads.control))
        uploads = NIOThreadPool(numberOfThreads: max(1, threads.uploads))
        unpack = NIOThreadPool(numberOfThreads: max(1, threads.unpack))
        for pool in [control, uploads, unpack] { pool.start() }
        let lower = threads.bulkNice > 0 || threads.bulkIdle
        Self.prepare(control, threads: max(1, threads.control), name: Self.controlThreadName, nice: 0, idle: false)
        let refused = Self.prepare(uploads, threads: max(1, threads.uploads), name: Self.uploadsThreadName, nice: lower ? threads.bulkNice : 0, idle: threads.bulkIdle)
        idlePolicyRefused = Self.prepare(unpack, threads: max(1, threads.unpack), name: Self.unpackThreadName, nice: lower ? threads.bulkNice : 0, idle: threads.bulkIdle) ?? refused
    }

    /// What the pools' threads are called (Linux: `top -H`, `ps -L`, `/proc/PID/task/*/comm`,
    /// profiles), so an operator sees which kind of work takes the CPU. At most 15 bytes.
    static let controlThreadName = "dredge-control"
    static let uploadsThreadName = "dredge-uploads"
    static let unpackThreadName = "dredge-unpack"

    /// Names every thread of `pool` and, unless `nice` is 0 and `idle` false, sets its nice
    /// value (and with `idle` the `SCHED_IDLE` policy): one item per thread, each holding its
    /// thread until all have run, so that no thread runs two. Returns when all are set: why
    /// the idle policy was refused, if it was.
    @discardableResult
    static func prepare(_ pool: NIOThreadPool, threads: Int, name: String, nice: Int, idle: Bool) -> String? {
        // Each item holds its thread until every one has arrived, so no thread runs two.
        let arrived = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let refused = Mutex<String?>(nil)
        for _ in 0..<threads {
            pool.submit { _ in
                ThreadPriority.setName(name)
                if nice != 0 || idle { ThreadPriority.setNice(nice) }
                if idle, let why = ThreadPriority.setIdlePolicy() { refused.withLock { $0 = why } }
                arrived.signal()
                release.wait()
            }
        }
        for _ in 0..<threads { arrived.wait() }
        for _ in 0..<threads { release.signal() }
        return refused.withLock { $0 }
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

/// The calling thread's scheduling priority, and its name.
enum ThreadPriority {
    /// Names the calling thread (what the kernel keeps: the first 15 bytes); a failure leaves
    /// the name it had.
    static func setName(_ name: String) {
        _ = dredge_set_thread_name(name)
    }

    /// The calling thread's name ("" where it is not known).
    static func name() -> String {
        var buffer = [CChar](repeating: 0, count: 16)
        guard dredge_thread_name(&buffer, Int64(buffer.count)) == 0 else { return "" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Sets the calling thread's nice value; elsewhere than Linux, nothing. Linux keeps the
    /// nice value per thread, and `PRIO_PROCESS` with id 0 names the calling thread. Lowering
    /// priority needs no privilege; a failure leaves the thread as it was.
    static func setNice(_ nice: Int) {
        #if os(Linux)
        _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, Int32(nice))
        #endif
    }

    /// Moves the calling thread to Linux's `SCHED_IDLE` policy (no privilege needed), its
    /// disk I/O kept best-effort; nil when done, else why not (the thread is left as it was,
    /// or under the policy with the I/O class Linux gives it).
    static func setIdlePolicy() -> String? {
        guard dredge_set_idle_policy(0) != 0 else { return nil }
        return String(cString: strerror(errno))
    }

    /// The calling thread's I/O priority class (Linux: 1 real-time, 2 best-effort, 3 idle;
    /// 0 none set), nil where it is not known.
    static func ioClass() -> Int? {
        let value = dredge_io_priority(0)
        return value < 0 ? nil : Int(value >> 13)
    }

    /// Whether the calling thread runs under `SCHED_IDLE`.
    static func hasIdlePolicy() -> Bool { dredge_has_idle_policy(0) == 1 }

    /// The calling thread's nice value (0 where it is not known).
    static func nice() -> Int {
        #if os(Linux)
        errno = 0
        let value = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        return errno == 0 ? Int(value) : 0
        #else
        return 0
        #endif
    }
}
