import DredgeLogging  // alone: the one import an app needs (types, levels, configuration)
import DredgeTestSupport
import Foundation
import Logging
import Synchronization
import Testing

/// What an app developer writes, as the README and docs/logging.md show it.
@Suite struct AppLibraryTests {
    let context = LogContext(host: "h", os: "Linux", app: "app", appVersion: "1", process: "p[1]")

    struct OrderID: LogValueConvertible {
        let raw: Int
        var logValue: LogValue { .string("order-\(raw)") }
    }

    @Test func variablesOfEveryCommonTypeAreMetadataWithOrWithoutPrivacy() throws {
        let recorder = LogRecorder()
        let center = try LogCenter.recording(recorder, context: context)
        defer { try? center.close() }
        let log = center.logger()
        let count = 3
        let amount = 12.5
        let retried = true
        let card = "4111 1111 1111 1111"
        let email = "alice@example.com"
        let when = Date(timeIntervalSince1970: 1_700_000_000.25)
        let id = UUID(uuidString: "6BA7B810-9DAD-11D1-80B4-00C04FD430C8")!
        let tags = ["a", "b"]
        let sizes = ["s": 1, "m": 2]
        let missing: Int? = nil
        let big = UInt64.max
        log.info("checkout", metadata: [
            "count": count, "amount": amount, "retried": retried, "when": when, "id": id, "tags": tags, "sizes": sizes,
            "order": OrderID(raw: 17), "missing": missing, "big": big, "nan": Double.nan,
            "card": .private(card), "email": .hashed(email), "count_h": .hashed(count), "literal": "x", "n": 5,
        ])
        try center.flush()
        let stored = try #require(try center.store.records(matching: .all).first).metadata
        #expect(stored["count"] == .int(3) && stored["amount"] == .double(12.5) && stored["retried"] == .bool(true))
        #expect(stored["when"] == .string("2023-11-14T22:13:20.250000Z"))
        #expect(stored["id"] == .string("6BA7B810-9DAD-11D1-80B4-00C04FD430C8"))
        #expect(stored["tags"] == .array(["a", "b"]) && stored["sizes"] == .object(["s": 1, "m": 2]))
        #expect(stored["order"] == .string("order-17") && stored["missing"] == .null)
        #expect(stored["big"] == .string("18446744073709551615") && stored["nan"] == .string("nan"))
        #expect(stored["card"] == .string("<private>"))
        #expect(stored["email"] == .string(center.redactor.hash(email)))
        #expect(stored["count_h"] == .string(center.redactor.hash("3")))
        #expect(stored["literal"] == .string("x") && stored["n"] == .int(5))
        #expect(recorder.entries.first?.metadata == stored, "the recorder sees what the store keeps")
    }

    @Test func anInvalidTypeLiteralIsNormalizedAndRecordedOnceNeverACrash() throws {
        let checkout: LogType = "Checkout Flow"
        #expect(checkout.rawValue == "checkout-flow")
        #expect(LogType(normalizing: "").rawValue == "app")
        #expect(LogType(normalizing: String(repeating: "X", count: 300)).rawValue == String(repeating: "x", count: LogType.maxLength))
        #expect(LogType(normalizing: "päyment/ok").rawValue == "p-yment-ok")
        #expect(LogType(normalizing: "business") == .business)

        let recorder = LogRecorder()
        let center = try LogCenter.recording(recorder, context: context)
        defer { try? center.close() }
        let log = center.logger(type: "Payments!")
        log.info("one")
        log.info("two")
        let warnings = recorder.entries.filter { $0.metadata["dredge.given_type"] == .string("Payments!") }
        #expect(warnings.count == 1 && warnings.first?.level == .warning && warnings.first?.metadata["dredge.type"] == .string("payments-"))
        #expect(recorder.entries.filter { $0.type.rawValue == "payments-" }.map(\.message) == ["one", "two"])
    }

    @Test func aConfigurationOutOfRangeIsAnErrorNotATrap() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        let center = try LogCenter(path: path, context: context)
        center.logger().info("kept")
        try center.close()
        for change in [
            { (c: inout StoreConfiguration) in c.queueCapacity = 0 }, { $0.maxBatchSize = -1 }, { $0.sizeCheckEveryBatches = 0 },
            { $0.limits.maxMessageBytes = -5 }, { $0.retention.lowWaterFraction = .nan }, { $0.retentionInterval = .zero },
        ] {
            var configuration = StoreConfiguration()
            change(&configuration)
            let error = #expect(throws: StoreError.self) { try LogCenter(path: path, configuration: configuration, context: context) }
            #expect(error?.code == .invalidConfiguration, "\(String(describing: error))")
        }
        let reopened = try LogStore(path: path)
        #expect(try reopened.records(matching: .all).map(\.message) == ["kept"], "nothing stored is lost")
        try reopened.close()
    }

    enum CheckoutEvent: DredgeEvent {
        case paymentFailed(amount: Double, card: String)
        case userLoggedIn(method: String)
        case cartEmptied

        var level: LogLevel {
            switch self {
            case .paymentFailed: .error
            default: .info
            }
        }
        var type: LogType? {
            switch self {
            case .paymentFailed: .business
            default: nil
            }
        }
        var fields: LogFields {
            switch self {
            case .paymentFailed(let amount, let card): ["amount": amount, "card": .private(card), "event": "overridden"]
            case .userLoggedIn(let method): ["method": method]
            case .cartEmptied: [:]
            }
        }
    }

    struct Checkout {
        let log: DredgeLogger
        func pay(card: String) { log.event(CheckoutEvent.paymentFailed(amount: 12.5, card: card)) }
    }

    @Test func typedEventsAreOneCallAndTheRecorderSeesThem() throws {
        let recorder = LogRecorder()
        let center = try LogCenter.recording(recorder, context: context)
        let log = center.logger(type: .app)
        log.event(CheckoutEvent.userLoggedIn(method: "password"))
        Checkout(log: log).pay(card: "4111 1111 1111 1111")
        log.event(CheckoutEvent.cartEmptied)
        var quiet = log
        quiet.minimumLevel = .warning
        quiet.event(CheckoutEvent.cartEmptied)

        #expect(recorder.events.map(\.name) == ["userLoggedIn", "paymentFailed", "cartEmptied"])
        let failed = try #require(recorder.events.first { $0.name == "paymentFailed" }?.entry)
        #expect(failed.level == .error && failed.type == .business && failed.message == "paymentFailed")
        #expect(failed.metadata["card"] == .string("<private>") && failed.metadata["amount"] == .double(12.5))
        #expect(failed.metadata["event"] == .string("paymentFailed"), "the name wins over a field of that name")
        #expect(recorder.events.first?.entry.type == .app, "an event without a type keeps the logger's")
        try center.flush()
        #expect(try center.store.count(matching: LogFilter(types: [.business])) == 1)
        #expect(recorder.entries(atLeast: .error).count == 1)
        let directory = (center.store.path as NSString).deletingLastPathComponent
        try center.close()
        #expect(!FileManager.default.fileExists(atPath: directory), "a recording center removes its store")
        recorder.reset()
        #expect(recorder.entries.isEmpty)
    }

    @Test func theConsoleEchoPrintsWhatIsStoredColouredByLevel() throws {
        let lines = LockedLines()
        let dir = TempDir()
        let center = try LogCenter(
            path: dir.file("logs.sqlite"), context: context, echo: ConsoleEcho(minimumLevel: .info, colors: .always, to: { lines.append($0) }))
        defer { try? center.close() }
        center.setUser("42")
        let log = center.logger(type: .business)
        log.debug("not echoed")
        log.error("payment failed", metadata: ["card": .private("4111"), "amount": 3])
        let printed = lines.all
        #expect(printed.count == 1)
        let line = try #require(printed.first)
        #expect(line.hasPrefix("\u{1B}[31m") && line.hasSuffix("\u{1B}[0m\n"))
        #expect(line.contains("ERROR") && line.contains("[business] payment failed uid=42 amount=3 card=<private>"))
        #expect(!line.contains("4111"))
        let plain = ConsoleEcho(colors: .never, to: { _ in }).line(LogEntry(level: .warning, type: .app, message: "m", context: center.context))
        #expect(!plain.contains("\u{1B}") && plain.contains("WARNING  [app] m"))
    }

    @Test func swiftLogMetadataNamesTheUser() throws {
        let recorder = LogRecorder()
        let center = try LogCenter.recording(recorder, context: context)
        defer { try? center.close() }
        center.setUser("current")
        var logger = Logger(label: "requests", factory: { center.logHandler(label: $0) })
        logger.info("as the current user")
        logger[metadataKey: "dredge.uid"] = "u-9"
        logger.info("for a request's user")
        logger.info("bad uid", metadata: ["dredge.uid": "a\nb"])
        #expect(recorder.entries.map(\.uid) == ["current", "u-9", "current"])
        #expect(recorder.entries[1].metadata["dredge.uid"] == nil)
        #expect(recorder.entries[2].metadata["dredge.uid"] == .string("a\nb"))
    }
}

final class LockedLines: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
}
