import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeTestSupport
import Foundation
import GRDB
import Testing
@testable import DredgeServer

/// What lands is searchable: a pull and a feedback through the real exporter, wire and server,
/// then the admin API's search route (over HTTP, with the admin token) finds exactly the
/// records the files hold; and the indexer's own rules on the files it reads.
@Suite struct RecordSearchTests {
    /// Waits (bounded) until nothing is waiting to be indexed.
    static func indexed(_ indexer: Indexer) async throws {
        for _ in 0..<1500 where indexer.backlog > 0 { try await Task.sleep(for: .milliseconds(20)) }
        #expect(indexer.backlog == 0)
    }

    /// Every line of the day files in `dir`, parsed.
    static func lines(in dir: String) throws -> [[String: Any]] {
        try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".jsonl") }.sorted().flatMap { file in
            try contents(dir + "/" + file).split(separator: "\n").map { line in
                try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            }
        }
    }

    static func all(_ admin: AdminClient, _ search: RecordSearch) async throws -> [FoundRecord] {
        var search = search
        var found: [FoundRecord] = []
        while true {
            let page = try await admin.search(search)
            found += page.records
            guard let next = page.next else { return found }
            search.after = next
        }
    }

    @Test func whatLandsIsSearchableThroughTheAdminAPI() async throws {
        try await withStopping(InProcessServer()) { server in
            let store = try server.deviceStore()
            let agent = try await server.enrollAgent(hostname: "oven-7")
            let feedbackID = Hex.encode(secureRandomBytes(16))
            let pullID = try await agent.connect { link in
                _ = try await server.admin.createPull(PullRequest(uid: "u-2", agent: agent.agentID, filter: LogFilter(uid: "u-2", levels: [.warning, .error, .critical])))
                let id = try await HostileAgentTests.completePull(agent, link: link, store: store, dir: server.dir)
                let outcome = try await LinkAgent.send(try agent.feedbackUpload(id: feedbackID, uid: "u-1", store: store, dir: server.dir), over: link)
                #expect(outcome.result.ok, "\(outcome)")
                return id
            }
            try await Self.indexed(server.indexer)
            let onDisk = try Self.lines(in: server.data + "/pulls/\(pullID)/\(agent.agentID)")
            #expect(onDisk.count > 100)

            // The pull, page by page: exactly the files' records, in time order, with their device.
            let found = try await Self.all(server.admin, RecordSearch(pull: pullID, limit: 333))
            #expect(found.map(\.message) == onDisk.map { $0["message"] as? String })
            #expect(found.map(\.ts.rfc3339) == onDisk.map { $0["ts"] as? String })
            #expect(found.allSatisfy { $0.uid == "u-2" && $0.host == "oven-7" && $0.app == "oven" && $0.agentID == agent.agentID && $0.sourceKind == "pull" })

            // The feedback's records are there too, and a uid search spans both.
            let feedbackFound = try await Self.all(server.admin, RecordSearch(feedback: feedbackID, limit: 5000))
            let feedbackOnDisk = try Self.lines(in: server.data + "/feedback/\(feedbackID)")
            #expect(feedbackFound.count == feedbackOnDisk.count && !feedbackFound.isEmpty)
            #expect(feedbackFound.allSatisfy { $0.sourceKind == "feedback" && $0.sourceID == feedbackID })

            // Full text and metadata: the same records a scan of the files finds.
            let declined = try await Self.all(server.admin, RecordSearch(pull: pullID, text: "payment declined"))
            let declinedOnDisk = onDisk.filter { ($0["message"] as? String)?.contains("payment declined") == true }
            #expect(declined.count == declinedOnDisk.count && !declined.isEmpty)
            let status503 = try await Self.all(server.admin, RecordSearch(pull: pullID, metadata: [MetadataMatch(key: "http.status", value: "503")]))
            let status503OnDisk = onDisk.filter { (($0["metadata"] as? [String: Any])?["http.status"] as? Int) == 503 }
            #expect(status503.count == status503OnDisk.count && !status503.isEmpty)

            // Every search is audited with its filter readable; its further pages are not recorded again.
            var audit = try await server.admin.audit().filter { $0.action == "records.search" }
            #expect(audit.count == 4, "four searches, whatever their pages")
            #expect(audit.contains { $0.detail.contains("pull=\(pullID)") && $0.detail.contains("where http.status=503") })
            // A search that starts at a page cursor or as a follow is recorded all the same.
            _ = try await server.admin.search(RecordSearch(uid: "u-3", after: "0.0"))
            _ = try await server.admin.search(RecordSearch(uid: "u-9", arrivedAfter: 0))
            audit = try await server.admin.audit().filter { $0.action == "records.search" }
            #expect(audit.count == 6 && audit.contains { $0.detail == "uid=u-3" } && audit.contains { $0.detail == "uid=u-9" })

            // A record by id, with its neighbours from the same payload; read audited once.
            let middle = found[found.count / 2]
            let around = try await server.admin.record(middle.id, context: 2)
            #expect(around.record == middle && around.before == Array(found[(found.count / 2 - 2)..<(found.count / 2)]))
            #expect(around.after == Array(found[(found.count / 2 + 1)...(found.count / 2 + 2)]))
            _ = try await server.admin.record(middle.id, context: 2)
            _ = try await server.admin.record(middle.id, context: 0)
            #expect(
                try await server.admin.audit().filter { $0.action == "records.read" }.map(\.detail) == ["record \(middle.id) context 0", "record \(middle.id) context 2"],
                "each read audited with what it showed, once in ten minutes")
            for (id, context) in [(middle.id, -1), (middle.id, 201), (0, 1)] {
                await #expect(throws: AdminClientError.self) { _ = try await server.admin.record(id, context: context) }
            }
            do {
                _ = try await server.admin.record(Int64.max, context: 1)
                Issue.record("a record that does not exist was found")
            } catch AdminClientError.notFound {}
            // The last page, read backwards from its end: the same records as read forwards.
            let tail = try await server.admin.search(RecordSearch(pull: pullID, before: "\(Int64.max).0", limit: 10))
            #expect(tail.records == Array(found.suffix(10)) && tail.previous != nil)

            // Bad searches are the caller's mistake, answered 400 with the reason.
            let bad: [RecordSearch] = [
                RecordSearch(after: "1.1", before: "2.2"),
                RecordSearch(pull: "../etc"), RecordSearch(text: "***"), RecordSearch(after: "x"), RecordSearch(levels: ["loud"]),
                RecordSearch(uid: String(repeating: "u", count: 5000)), RecordSearch(text: "nul\u{0}byte"),
                RecordSearch(metadata: [MetadataMatch(key: "a\"b", value: "1")]), RecordSearch(metadata: (0..<65).map { MetadataMatch(key: "k\($0)", value: "v") }),
                RecordSearch(since: Timestamp(microseconds: -1)), RecordSearch(since: Timestamp(microseconds: 10), until: Timestamp(microseconds: 5)),
            ]
            for search in bad {
                do {
                    _ = try await server.admin.search(search)
                    Issue.record("accepted: \(search)")
                } catch let error as AdminClientError {
                    guard case .badRequest = error else {
                        Issue.record("\(search): \(error)")
                        continue
                    }
                }
            }
        }
    }

    // MARK: The indexer on the files

    /// A finished pull's directory as the server leaves it: day files and the manifest.
    static func land(_ paths: DataDirectory, _ source: IndexedSource, days: [String: [String]], manifestDays: [String]? = nil) throws {
        let dir = source.kind == .pull ? try paths.pullFiles(source.id, agent: source.agentID) : try paths.feedbackFiles(source.id)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        var described: [ExportManifest.Day] = []
        for (file, lines) in days.sorted(by: { $0.key < $1.key }) {
            let text = lines.map { $0 + "\n" }.joined()
            try Data(text.utf8).write(to: URL(fileURLWithPath: dir + "/" + file))
            described.append(ExportManifest.Day(file: file, records: lines.count, bytes: text.utf8.count, first: "", last: ""))
        }
        for name in manifestDays ?? [] { described.append(ExportManifest.Day(file: name, records: 1, bytes: 1, first: "", last: "")) }
        let manifest = ExportManifest(
            format: ExportManifest.formatName, uploadID: source.id, kind: source.kind.rawValue, commandID: source.kind == .pull ? source.id : nil,
            agentID: source.agentID, createdAt: Timestamp.now.rfc3339, filter: ExportManifest.FilterDescription(LogFilter()), recordCount: 0, empty: days.isEmpty,
            days: described, contexts: RecordIndexConformanceTests.contexts, losses: [], feedback: nil)
        try Data(try manifest.encoded()).write(to: URL(fileURLWithPath: dir + "/" + PayloadLimits.manifestName))
    }

    @Test func atStartItIndexesWhatLandedBeforeAndStartsOverWhatWasCutShort() async throws {
        let dir = TempDir()
        let paths = DataDirectory(dir.path)
        let index = try SQLiteRecordIndex(directory: dir.path)
        let a = RecordIndexConformanceTests.pull1, b = RecordIndexConformanceTests.feedback2
        try Self.land(paths, a, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(1, "a one"), RecordIndexConformanceTests.line(2, "a two")]])
        try Self.land(paths, b, days: ["2027-01-15.jsonl": [RecordIndexConformanceTests.line(3, "b one", context: 2)]])
        // Not results: staging left by a crash, and a name that is no id.
        try FileManager.default.createDirectory(atPath: paths.pulls + "/" + a.id + "/" + a.agentID + ".partial", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: paths.pulls + "/not-an-id/x", withIntermediateDirectories: true)
        // Source a was cut short by a crash: begun, one record in, never finished.
        try await index.begin(a, contexts: [:], landedAt: Date())
        _ = try await index.add(a, lines: Array((RecordIndexConformanceTests.line(1, "a one") + "\n").utf8))

        #expect(Set(try Indexer.landedSources(paths)) == [a, b])
        let indexer = Indexer(index: index, registry: nil, paths: paths, logger: .init(label: "test"))
        try await withBackground({ try await indexer.run() }) {
            for _ in 0..<1500 where try await index.indexedSources().count < 2 { try await Task.sleep(for: .milliseconds(20)) }
            #expect(try await index.indexedSources() == [a, b])
            let found = try await index.search(RecordSearch()).records
            #expect(found.map(\.message) == ["a one", "a two", "b one"], "each record once")
            #expect(found.last?.host == "bakery-oven")
        }
    }

    /// A metadata search reads records in time order first, at most a bound of them, and turns
    /// to the full-text index when that does not fill a page: whatever the bound, the pages are
    /// the same, in order, without gaps or repeats.
    @Test func metadataPagesAreTheSameWhicheverWayTheyAreFound() async throws {
        let dir = TempDir()
        let sources = (0..<3).map { IndexedSource(kind: .pull, id: String(format: "%032x", $0 + 10), agentID: RecordIndexConformanceTests.agentA) }
        // Many records share an instant (four seconds' worth of lines a second), so the scan's
        // bound falls among records at its own time.
        var expected: [(second: Int, n: Int, i: Int)] = []
        for (n, source) in sources.enumerated() {
            var lines: [String] = []
            for i in 0..<40 {
                let second = (i * 3 + n) / 4
                let hit = (i * 7 + n) % 5 == 0
                if hit { expected.append((second, n, i)) }
                lines.append(RecordIndexConformanceTests.line(second, "r\(n)-\(i)", metadata: hit ? #"{"status":503}"# : #"{"status":200,"note":"503"}"#))
            }
            try Self.land(DataDirectory(dir.path), source, days: ["2027-01-15.jsonl": lines])
        }
        // In time, then arrival: sources were indexed in order, their lines in order.
        let inOrder = expected.sorted { ($0.second, $0.n, $0.i) < ($1.second, $1.n, $1.i) }.map { "r\($0.n)-\($0.i)" }
        for scanLimit in [1, 5, 17, 200, 50_000] {
            try FileManager.default.createDirectory(atPath: dir.file("index-\(scanLimit)"), withIntermediateDirectories: true)
            let index = try SQLiteRecordIndex(directory: dir.file("index-\(scanLimit)"), scanLimit: scanLimit)
            let indexer = Indexer(index: index, registry: nil, paths: DataDirectory(dir.path), logger: .init(label: "test"))
            for source in sources { try await indexer.index(source) }
            for limit in [1, 3, 10, 100] {
                // Alone, and with a filter the scan's bound is found under too.
                for uid in [nil, "u-1"] {
                    var seen: [String] = []
                    var search = RecordSearch(uid: uid, metadata: [MetadataMatch(key: "status", value: "503")], limit: limit)
                    while true {
                        let page = try await index.search(search)
                        seen += page.records.map(\.message)
                        guard let next = page.next else { break }
                        search.after = next
                    }
                    #expect(seen == inOrder, "scan \(scanLimit), limit \(limit), uid \(uid ?? "-")")
                }
            }
        }
    }

    @Test func aManifestNamingAFileOutsideItsDirectoryIsRefused() async throws {
        let dir = TempDir()
        let paths = DataDirectory(dir.path)
        let index = try SQLiteRecordIndex(directory: dir.path)
        let source = RecordIndexConformanceTests.pull1
        try Data("{\"secret\":1}\n".utf8).write(to: URL(fileURLWithPath: dir.file("secret.jsonl")))
        for hostile in ["../../../secret.jsonl", "/etc/passwd", "manifest.json", "2027-02-30.jsonl"] {
            try? FileManager.default.removeItem(atPath: try paths.pull(source.id))
            try Self.land(paths, source, days: [:], manifestDays: [hostile])
            let indexer = Indexer(index: index, registry: nil, paths: paths, logger: .init(label: "test"))
            await #expect(throws: IndexingError.self, "\(hostile)") { try await indexer.index(source) }
            #expect(try await index.indexedSources().isEmpty)
        }
        // A manifest that is not one, and a missing day file: errors, nothing listed as indexed.
        try Data("not json".utf8).write(to: URL(fileURLWithPath: try paths.pullFiles(source.id, agent: source.agentID) + "/manifest.json"))
        await #expect(throws: IndexingError.self) { try await Indexer(index: index, registry: nil, paths: paths, logger: .init(label: "test")).index(source) }
        try FileManager.default.removeItem(atPath: try paths.pull(source.id))
        try Self.land(paths, source, days: [:], manifestDays: ["2027-01-15.jsonl"])
        await #expect(throws: IndexingError.self) { try await Indexer(index: index, registry: nil, paths: paths, logger: .init(label: "test")).index(source) }
        #expect(try await index.indexedSources().isEmpty)
    }

    @Test func blocksAreWholeLinesWhateverTheirLength() throws {
        let dir = TempDir()
        let path = dir.file("day.jsonl")
        let lines = (0..<200).map { String(repeating: "x", count: $0 * 7 % 97) + "|\($0)" }
        try Data((lines.joined(separator: "\n")).utf8).write(to: URL(fileURLWithPath: path))  // no newline at the end
        for blockBytes in [1, 5, 64, 1000, 1 << 20] {
            let reader = try LineBlockReader(path: path, blockBytes: blockBytes)
            var seen: [String] = []
            while let block = try reader.next() {
                #expect(block.last == 0x0A)
                seen += String(decoding: block.dropLast(), as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            }
            #expect(seen == lines, "block \(blockBytes)")
            #expect(reader.overlong == 0)
        }
    }

    /// A line longer than the limit (a hostile agent's day file of one 2 GiB line, in small) is
    /// skipped and counted; the lines around it are read, and memory stays bounded.
    @Test func overLongLinesAreSkippedAndCounted() throws {
        let dir = TempDir()
        let path = dir.file("day.jsonl")
        let text = "short one\n" + String(repeating: "y", count: 5000) + "\nshort two\n" + String(repeating: "z", count: 3000)
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        // Reads smaller than the long lines: they cross reads, as a 2 GiB line crosses 4 MiB ones.
        for blockBytes in [7, 100, 999] {
            let reader = try LineBlockReader(path: path, blockBytes: blockBytes, maxLineBytes: 1000)
            var seen: [String] = []
            while let block = try reader.next() {
                #expect(block.count <= blockBytes + 1001)
                seen += String(decoding: block.dropLast(), as: UTF8.self).split(separator: "\n").map(String.init)
            }
            #expect(seen == ["short one", "short two"], "block \(blockBytes)")
            #expect(reader.overlong == 2, "block \(blockBytes)")
        }
    }

    /// Words in `record_text` for a full-text query, counted straight in the file.
    static func textMatches(_ path: String, _ query: String) throws -> Int {
        try DatabaseQueue(path: path).read { try Int.fetchOne($0, sql: "SELECT count(*) FROM record_text WHERE record_text MATCH ?", arguments: [query]) ?? -1 }
    }

    /// An index made before the uid was a word of `record_text` is filled again when it is
    /// opened, so a search by uid and text finds what it held; a removed source takes its words
    /// with it; text never matches the uid's word.
    @Test func theTextIndexHoldsEachRecordsUidAndFollowsItsRecords() async throws {
        let dir = TempDir()
        let path = dir.file(SQLiteRecordIndex.fileName)
        let old = try DatabaseQueue(path: path)
        try SQLiteRecordIndex.migrator.migrate(old, upTo: "index-v1")
        try await old.write { db in
            try db.execute(sql: "INSERT INTO source (id, kind, ref, agent, indexed, records, landed_at) VALUES (1, 'pull', ?, ?, 1, 2, 0)", arguments: [RecordIndexConformanceTests.pull1.id, RecordIndexConformanceTests.agentA])
            for (uid, message) in [("zoë", "card declined"), ("ann", "card declined")] {
                try db.execute(sql: "INSERT INTO record (source, ts, uid, level, type, message, metadata) VALUES (1, 1, ?, 2, 'app', ?, '{}')", arguments: [uid, message])
            }
            try db.execute(sql: "INSERT INTO record_text (rowid, message, metadata) SELECT id, message, metadata FROM record")
        }
        try old.close()

        let index = try SQLiteRecordIndex(directory: dir.path)
        #expect(try await index.search(RecordSearch(uid: "zoë", text: "declined")).records.map(\.uid) == ["zoë"])
        #expect(try await index.search(RecordSearch(text: "declined")).records.count == 2)
        let zoeWord = SQLRecordQuery.uidWord("zoë")
        #expect(try Self.textMatches(path, "uid : \(zoeWord)") == 1)
        #expect(try await index.search(RecordSearch(text: zoeWord)).records.isEmpty, "the uid's word is not text")

        // Removing the source takes its words out too (a trigger passing other values than the
        // ones inserted would leave them behind).
        try await index.remove(RecordIndexConformanceTests.pull1)
        #expect(try Self.textMatches(path, "declined") == 0)
        #expect(try Self.textMatches(path, "uid : \(zoeWord)") == 0)
        // Indexed anew, through the store's own path: found by uid and text again.
        let source = RecordIndexConformanceTests.pull1b
        try await index.begin(source, contexts: RecordIndexConformanceTests.contexts, landedAt: Date())
        _ = try await index.add(source, lines: Array((RecordIndexConformanceTests.line(1, "card declined", uid: "zoë") + "\n").utf8))
        try await index.finish(source)
        #expect(try await index.search(RecordSearch(uid: "zoë", text: "declined")).records.map(\.agentID) == [source.agentID])
        #expect(try Self.textMatches(path, "uid : \(zoeWord) AND declined") == 1)
    }

    @Test func aDamagedIndexIsMovedAsideAndMadeAgain() throws {
        let dir = TempDir()
        try Data(repeating: 0x41, count: 10_000).write(to: URL(fileURLWithPath: dir.file(SQLiteRecordIndex.fileName)))
        let index = try SQLiteRecordIndex.openOrRebuild(directory: dir.path)
        #expect(FileManager.default.fileExists(atPath: index.path))
        let names = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        #expect(names.contains { $0.hasPrefix(SQLiteRecordIndex.fileName + ".damaged-") }, "\(names)")
    }
}
