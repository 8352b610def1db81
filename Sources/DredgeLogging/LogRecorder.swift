import DredgeDomain
import DredgeStore
import Synchronization

/// Keeps every record a ``LogCenter`` enqueues, in memory, for a test to check what the code
/// under test logged: the records exactly as the store receives them (private values already
/// `<private>`, hashed ones `<hash:…>`). Attach it with ``LogCenter/recording(_:context:)``
/// (a real store in a temporary directory) or the `recorder:` argument of a center's
/// initializer.
///
/// ```swift
/// let recorder = LogRecorder()
/// let center = try LogCenter.recording(recorder)
/// defer { try? center.close() }
/// Checkout(log: center.logger(type: .business)).pay(card: "4111 1111 1111 1111")
/// #expect(recorder.events.map(\.name) == ["paymentFailed"])
/// #expect(recorder.entries.last?.metadata["card"] == .string("<private>"))
/// ```
public final class LogRecorder: Sendable {
    /// A ``DredgeEvent`` as recorded: its name and the record.
    public struct Event: Sendable {
        public var name: String
        public var entry: LogEntry
    }

    private let kept = Mutex<[LogEntry]>([])
    /// At most this many records are kept (the oldest go first).
    public let capacity: Int

    public init(capacity: Int = 100_000) {
        self.capacity = max(1, capacity)
    }

    func record(_ entry: LogEntry) {
        kept.withLock {
            if $0.count >= capacity { $0.removeFirst($0.count - capacity + 1) }
            $0.append(entry)
        }
    }

    /// Every record, oldest first.
    public var entries: [LogEntry] { kept.withLock { $0 } }

    /// The records of ``DredgeEvent``s (those with an ``eventKey``), oldest first.
    public var events: [Event] {
        entries.compactMap { entry in
            guard case .string(let name)? = entry.metadata[eventKey] else { return nil }
            return Event(name: name, entry: entry)
        }
    }

    /// The records at `level` or above.
    public func entries(atLeast level: LogLevel) -> [LogEntry] { entries.filter { $0.level >= level } }

    /// Forgets everything recorded so far.
    public func reset() { kept.withLock { $0 = [] } }
}
