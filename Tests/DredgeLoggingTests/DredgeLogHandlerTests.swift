import DredgeDomain
import DredgeLogging
import DredgeStore
import DredgeTestSupport
import Foundation
import Logging
import Testing

@Suite struct DredgeLogHandlerTests {
    struct Failure: Error, CustomStringConvertible { var description: String { "socket closed" } }

    @Test func mapsLabelLevelMetadataAndSource() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: .current(app: "tests"))
        center.setUser("u-9")
        var handler = center.logHandler(label: "com.example.checkout", type: .business)
        handler.logLevel = .debug
        handler.includeSourceLocation = true
        var logger = Logger(label: "com.example.checkout") { _ in handler }
        logger[metadataKey: "request"] = "r-1"
        logger.trace("below the level")
        logger.debug("cart loaded", metadata: ["items": "3", "tags": ["a", "b"], "nested": ["k": "v"]])
        logger.error("payment failed", metadata: ["request": "r-2", "dredge.type": "network"])
        try center.flush()

        let records = try center.store.records(matching: .all)
        #expect(records.count == 2)
        let first = records[0]
        #expect(first.level == .debug && first.type == .business && first.uid == "u-9")
        #expect(first.message == "cart loaded")
        let meta = first.metadata
        #expect(meta["items"] == "3")
        #expect(meta["tags"] == ["a", "b"])
        #expect(meta["nested"] == ["k": "v"])
        #expect(meta["request"] == "r-1")
        #expect(meta["logger.label"] == "com.example.checkout")
        #expect(meta["logger.source"] == "DredgeLoggingTests")
        #expect(meta["code.file"] != nil && meta["code.line"] != nil)
        let second = records[1]
        #expect(second.level == .error && second.type == .network)
        #expect(second.metadata["request"] == "r-2")
        #expect(second.metadata["dredge.type"] == nil)
    }

    @Test func honoursThePrivacyAttribute() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: .current(app: "tests"))
        let logger = Logger(label: "privacy") { center.logHandler(label: $0) }
        let email = "bob@example.com"
        logger.info("signup", metadata: ["email": "\(email, privacy: .hashed)", "token": "\("secret-token", privacy: .private)", "plan": "\("pro", privacy: .public)"])
        try center.flush()
        let meta = try center.store.records(matching: .all)[0].metadata
        #expect(meta["email"] == .string(center.redactor.hash(email)))
        #expect(meta["token"] == "<private>")
        #expect(meta["plan"] == "pro")
    }

    @Test func usesTheMetadataProviderAndStoresErrors() throws {
        let dir = TempDir()
        let center = try LogCenter(path: dir.file("logs.sqlite"), context: .current(app: "tests"))
        var handler = center.logHandler(label: "nio")
        handler.metadataProvider = Logger.MetadataProvider { ["trace.id": "t-1"] }
        let logger = Logger(label: "nio") { _ in handler }
        logger.warning("connection reset", error: Failure())
        try center.flush()
        let meta = try center.store.records(matching: .all)[0].metadata
        #expect(meta["trace.id"] == "t-1")
        #expect(meta["error"] == "socket closed")
    }
}
