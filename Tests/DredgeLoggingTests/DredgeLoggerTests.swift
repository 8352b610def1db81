import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import Testing

@Suite struct DredgeLoggerTests {
    let context = LogContext(host: "h", os: "Linux", app: "app", appVersion: "1", process: "p[1]")

    @Test func stampsTheCurrentUserUntilItChanges() throws {
        let dir = TempDir()
        // Stamping alone: records before the sign-in stay anonymous (RecordsBeforeSignInTests).
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: context, beforeSignIn: .none)
        let log = center.logger(type: .business)
        log.info("anonymous")
        center.setUser("42")
        log.info("logged in")
        log.log(.info, "for someone else", uid: "7")
        center.setUser(nil)
        log.info("logged out")
        try center.flush()
        let records = try center.store.records(matching: .all)
        #expect(records.map(\.uid) == ["", "42", "7", ""])
        #expect(records.allSatisfy { $0.type == .business && $0.context == center.context })
        #expect(try center.store.contexts([center.context])[center.context] == context)
    }

    @Test func privateValuesNeverReachTheStoreAndHashedOnesCorrelate() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: context)
        let log = center.logger()
        let email = "alice@example.com"
        log.warning(
            "login failed for \(email, privacy: .hashed) with password \("hunter2", privacy: .private) from \("10.0.0.1")",
            metadata: ["email": .hashed(.string(email)), "card": .private("4111111111111111"), "attempt": 3, "plain": "visible"])
        log.info("again \(email, privacy: .hashed)")
        try center.flush()
        let records = try center.store.records(matching: .all)
        let hash = center.redactor.hash(email)
        #expect(hash.hasPrefix("<hash:") && hash.count == "<hash:>".count + 16)
        #expect(records[0].message == "login failed for \(hash) with password <private> from 10.0.0.1")
        #expect(records[0].metadata == ["email": .string(hash), "card": "<private>", "attempt": 3, "plain": "visible"])
        #expect(records[1].message == "again \(hash)")
        // Nothing secret is anywhere in the file.
        try center.close()
        for file in ["logs.sqlite", "logs.sqlite-wal"] {
            guard let data = FileManager.default.contents(atPath: dir.file(file)) else { continue }
            for secret in [email, "hunter2", "4111111111111111"] {
                #expect(data.range(of: Data(secret.utf8)) == nil, "\(secret) found in \(file)")
            }
        }
    }

    @Test func hashesAreStableOnOneInstallAndDifferAcrossInstalls() throws {
        let dir = TempDir()
        let first = try LogCenter(path: dir.file("a.sqlite"), context: context)
        let hash = first.redactor.hash("user@example.com")
        try first.close()
        let reopened = try LogCenter(path: dir.file("a.sqlite"), context: context)
        #expect(reopened.redactor.hash("user@example.com") == hash)
        #expect(reopened.redactor.hash("other@example.com") != hash)
        let otherInstall = try LogCenter(path: dir.file("b.sqlite"), context: context)
        #expect(otherInstall.redactor.hash("user@example.com") != hash)
    }

    @Test func loggerMetadataLevelsAndTimestamps() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: context)
        var log = center.logger(type: .player, minimumLevel: .info, metadata: ["session": "s1", "k": "base"])
        log.debug("dropped below the minimum level")
        log.error("boom", metadata: ["k": "call wins"])
        log.type = "custom"
        log.log(.notice, "replayed", at: Timestamp(rfc3339: "2026-01-01T00:00:00Z"))
        try center.flush()
        let records = try center.store.records(matching: .all)
        #expect(records.count == 2)
        #expect(records[0].message == "replayed" && records[0].type == LogType("custom"))
        #expect(records[0].timestamp == Timestamp(rfc3339: "2026-01-01T00:00:00Z"))
        #expect(records[1].level == .error && records[1].type == .player)
        #expect(records[1].metadata == ["session": "s1", "k": "call wins"])
    }

    @Test func flushedRecordsSurviveSIGKILL() throws {
        let dir = TempDir()
        let path = dir.file("logs.sqlite")
        // Wait until the child says flush() returned, then kill it at once.
        let (child, line) = try startCrashChild([path, "5000"])
        kill(child.processIdentifier, SIGKILL)
        child.waitUntilExit()
        #expect(line == "flushed 5000\n")
        #expect(child.terminationReason == .uncaughtSignal)

        let store = try LogStore(path: path)
        let durable = try store.records(matching: LogFilter(text: "durable "))
        #expect(durable.count == 5000)
        #expect(Set(durable.map(\.message)) == Set((0..<5000).map { "durable \($0)" }))
        #expect(durable.allSatisfy { $0.uid == "crash-user" && $0.type == .business })
    }
}
