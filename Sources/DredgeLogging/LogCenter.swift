import DredgeDomain
import DredgeStore
import Synchronization

/// The client side an app embeds: one per store and process. It stamps every record with the
/// current user and the process's context row, applies privacy, and hands records to the store.
///
/// ```swift
/// let center = try LogCenter(path: "/var/lib/myapp/logs.sqlite", context: .current(app: "oven", appVersion: "2.1"))
/// center.setUser("42")                      // on login; setUser(nil) on logout
/// let log = center.logger(type: .business)
/// log.info("order placed", metadata: ["order": "A-17", "email": .hashed(email)])
/// LoggingSystem.bootstrap { center.logHandler(label: $0) }   // swift-log users log here too
/// ```
public final class LogCenter: Sendable {
    public let store: LogStore
    /// The context row every record of this center refers to.
    public let context: ContextID
    public let redactor: Redactor
    private let currentUID = Mutex("")
    private let ownsStore: Bool

    /// Uses an open store (several centers may share one, each with its own context).
    public init(store: LogStore, context: LogContext = .current()) throws {
        self.store = store
        self.context = try store.register(context)
        self.redactor = Redactor(installKey: store.installKey)
        self.ownsStore = false
    }

    /// Opens the store at `path` and owns it: ``close()`` closes it.
    public init(path: String, configuration: StoreConfiguration = StoreConfiguration(), context: LogContext = .current()) throws {
        let store = try LogStore(path: path, configuration: configuration)
        self.store = store
        self.context = try store.register(context)
        self.redactor = Redactor(installKey: store.installKey)
        self.ownsStore = true
    }

    /// The uid stamped on records from now on; empty when nobody is logged in.
    public var uid: String { currentUID.withLock { $0 } }

    /// Sets the logged-in user (login) or clears it with nil (logout). Records logged after the
    /// call carry the new uid; records already enqueued keep theirs.
    public func setUser(_ uid: String?) { currentUID.withLock { $0 = uid ?? "" } }

    public func logger(type: LogType = .app, minimumLevel: LogLevel = .trace, metadata: LogFields = [:]) -> DredgeLogger {
        DredgeLogger(center: self, type: type, minimumLevel: minimumLevel, metadata: metadata)
    }

    /// A swift-log handler writing into this center's store. See ``DredgeLogHandler``.
    public func logHandler(label: String, type: LogType = .app) -> DredgeLogHandler {
        DredgeLogHandler(label: label, center: self, type: type)
    }

    /// Enqueues a finished entry stamped with this center's context and current uid (unless the
    /// entry already names one).
    @discardableResult
    func submit(level: LogLevel, type: LogType, message: String, metadata: LogMetadata, at timestamp: Timestamp?, uid: String?) -> Bool {
        store.enqueue(
            LogEntry(
                timestamp: timestamp ?? .now, level: level, type: type, uid: uid ?? self.uid, message: message,
                metadata: metadata, context: context))
    }

    /// Waits until everything logged before the call is durable. See ``LogStore/flush()``.
    public func flush() throws { try store.flush() }
    public func flush() async throws { try await store.flush() }

    /// Closes the store if this center opened it.
    public func close() throws {
        if ownsStore { try store.close() } else { try store.flush() }
    }
}
