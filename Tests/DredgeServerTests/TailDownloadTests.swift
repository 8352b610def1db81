import AsyncHTTPClient
import DredgeAdminAPI
import DredgeAdminClient
import DredgeDomain
import DredgeTestSupport
import Foundation
import NIOCore
import NIOHTTP1
import Testing
@testable import DredgeServer

/// Downloading what a live tail held (#53), against the in-process server over real HTTP: each
/// device's records and contexts listed and served only as far as they are held (a batch
/// written but not recorded as held, a context line cut short, are never served), a download of
/// a running tail that goes on from an earlier one, who may download, bad names, removal, the
/// audit, and the console's links. `dredge fetch TAIL` with real processes is in
/// `LiveTailEndToEndTests`.
@Suite struct TailDownloadTests {
    static let agent = String(repeating: "cd", count: 16)

    /// A tail with one device's part, and a way to hold batches of it as a node does.
    final class HeldTail: @unchecked Sendable {
        let server: InProcessServer
        let id: String
        let directory: String
        private var known: TailFiles.KnownContexts?
        private(set) var held: Int64 = 0
        private var seq: UInt64 = 0

        init(_ server: InProcessServer) async throws {
            self.server = server
            id = try await server.admin.createTail(TailRequest(uid: "u-1", durationSeconds: 600, reason: "T-1")).id
            _ = try await server.tails.deliver(id, agent: TailDownloadTests.agent, wrappedKey: try server.issuer.newTailKey(), at: Date())
            _ = try await server.tails.accepted(id, agent: TailDownloadTests.agent, startCursor: 0, at: Date())
            directory = try DataDirectory(server.data).tailFiles(id, agent: TailDownloadTests.agent)
        }

        func hold(_ messages: [String], context: Int64 = 3) async throws {
            seq += 1
            let records = messages.map { Array(#"{"ts":"2026-11-30T10:00:00.000000Z","level":"warning","type":"app","uid":"u-1","message":"\#($0)","metadata":{},"context":\#(context)}"#.utf8) }
            let batch = TailBatchReader.Batch(
                records: records, contexts: [context: Array(#"{"app":"till","appVersion":"1.\#(context)","host":"far","os":"Linux","process":"tilld"}"#.utf8)],
                times: records.map { _ in 0 })
            held = try TailFiles.append(batch, after: held, known: &known, in: directory)
            #expect(try await server.tails.held(id, agent: TailDownloadTests.agent, seq: seq, cursor: seq, records: messages.count, dropped: 0, bytes: held, at: Date()))
        }

        func bytes(_ name: String) throws -> Data { try Data(contentsOf: URL(fileURLWithPath: directory + "/" + name)) }

        /// Appends to a file as a write the server never recorded (it stopped in between) leaves it.
        func leaveUnheld(_ text: String, in name: String) throws {
            let handle = try #require(FileHandle(forWritingAtPath: directory + "/" + name))
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(text.utf8))
            try handle.close()
        }
    }

    @Test func whatATailHeldIsDownloadedAsFarAsItIsHeld() async throws {
        try await withStopping(InProcessServer()) { server in
            let tail = try await HeldTail(server)
            // Before any record: nothing to download.
            #expect(try await server.admin.tailFiles(tail.id).isEmpty)
            try await tail.hold(["r1", "r2"])
            let heldRecords = try tail.bytes(TailFiles.records), heldContexts = try tail.bytes(TailFiles.contexts)
            // A batch written but not recorded as held, and a context line cut short: never served.
            try tail.leaveUnheld(#"{"ts":"2026-11-30T10:00:01.000000Z","level":"error","message":"unheld"}"# + "\n", in: TailFiles.records)
            try tail.leaveUnheld(#"{"9":{"app":"cut"#, in: TailFiles.contexts)

            let listed = try await server.admin.tailFiles(tail.id)
            #expect(listed.map(\.name) == ["contexts.jsonl", "records.jsonl"] && listed.allSatisfy { $0.agentID == Self.agent })
            #expect(listed.map(\.kind) == [.contexts, .records])
            let records = try #require(listed.first { $0.kind == .records }), contexts = try #require(listed.first { $0.kind == .contexts })
            #expect(records.size == tail.held && records.sha256 == FileDigest.sha256(heldRecords))
            #expect(contexts.size == Int64(heldContexts.count) && contexts.sha256 == FileDigest.sha256(heldContexts))

            let out = server.dir.file("fetched")
            #expect(try await server.admin.download(tail: tail.id, file: records, to: out + "/records.jsonl") == .downloaded)
            #expect(try await server.admin.download(tail: tail.id, file: contexts, to: out + "/contexts.jsonl") == .downloaded)
            #expect(try Data(contentsOf: URL(fileURLWithPath: out + "/records.jsonl")) == heldRecords)
            #expect(try Data(contentsOf: URL(fileURLWithPath: out + "/contexts.jsonl")) == heldContexts)
            #expect(try await server.admin.download(tail: tail.id, file: records, to: out + "/records.jsonl") == .present)

            // The tail goes on (the unheld bytes are written over, as a node does): the earlier
            // download is the start of the file now listed, and goes on from its end.
            try await tail.hold(["r3"], context: 4)
            let again = try #require(try await server.admin.tailFiles(tail.id).first { $0.kind == .records })
            #expect(again.size == tail.held && again.size > records.size)
            #expect(try await server.admin.download(tail: tail.id, file: again, to: out + "/records.jsonl") == .resumed(from: records.size))
            let whole = try Data(contentsOf: URL(fileURLWithPath: out + "/records.jsonl"))
            let nowHeld = try tail.bytes(TailFiles.records).prefix(Int(tail.held))
            #expect(whole == nowHeld && String(decoding: whole, as: UTF8.self).contains("r3"))
            #expect(!String(decoding: whole, as: UTF8.self).contains("unheld"))
            // A file listed before more was held is still served as listed (a range of what is held now).
            try await tail.hold(["r4"])
            let stale = server.dir.file("stale/records.jsonl")
            #expect(try await server.admin.download(tail: tail.id, file: again, to: stale) == .downloaded)
            #expect(try Data(contentsOf: URL(fileURLWithPath: stale)) == whole)

            // Served as the API serves any file: the ETag is the SHA-256 of what is served, a range is
            // honoured. Bytes not held at the file's end are not sent, asked for or not.
            try tail.leaveUnheld(#"{"ts":"2026-11-30T10:00:02.000000Z","level":"error","message":"unheld again"}"# + "\n", in: TailFiles.records)
            let http = HTTPClient(eventLoopGroupProvider: .singleton)
            do {
                func get(_ path: String, _ headers: [(String, String)] = []) async throws -> (HTTPClientResponse, String) {
                    var request = HTTPClientRequest(url: server.adminURL + path)
                    request.headers.add(name: "Authorization", value: "Bearer \(server.created.adminToken)")
                    for (name, value) in headers { request.headers.add(name: name, value: value) }
                    let response = try await http.execute(request, timeout: .seconds(300))
                    return (response, String(buffer: try await response.body.collect(upTo: 1 << 20)))
                }
                let base = "/v1/tails/\(tail.id)/files/\(Self.agent)/"
                let (full, body) = try await get(base + "records.jsonl")
                #expect(full.status == .ok && body.utf8.count == Int(tail.held) && full.headers.first(name: "Content-Length") == String(tail.held))
                #expect(!body.contains("unheld"))
                #expect(full.headers.first(name: "ETag") == "\"\(FileDigest.sha256(Data(body.utf8)))\"")
                #expect(full.headers.first(name: "Content-Type") == "application/x-ndjson")
                let (part, partBody) = try await get(base + "records.jsonl", [("Range", "bytes=0-9")])
                #expect(part.status == .partialContent && partBody == String(body.prefix(10)))
                let (past, _) = try await get(base + "records.jsonl", [("Range", "bytes=\(tail.held)-")])
                #expect(past.status == .rangeNotSatisfiable, "nothing past what is held")
                // Only the listing's names, only its devices.
                for bad in [base + "..%2F..%2Fca.pem", base + "manifest.json", "/v1/tails/\(tail.id)/files/\(String(repeating: "ab", count: 16))/records.jsonl"] {
                    let (response, _) = try await get(bad)
                    #expect(response.status == .notFound, "\(bad)")
                }
                let (badAgent, _) = try await get("/v1/tails/\(tail.id)/files/not-an-id/records.jsonl")
                #expect(badAgent.status == .badRequest)
                let (noTail, _) = try await get("/v1/tails/\(String(repeating: "ef", count: 16))/files")
                #expect(noTail.status == .notFound)
                try await http.shutdown()
            } catch {
                try await http.shutdown()
                throw error
            }

            // Audited once per device's files in ten minutes, naming the file that began it.
            let audit = try await server.admin.audit(AuditQuery(action: "tail.download"))
            #expect(audit.count == 1 && audit[0].actor == "admin" && audit[0].detail.contains("tail \(tail.id) agent \(Self.agent)"), "\(audit)")

            // Only its requester or an admin reads its records: a reader and another investigator are refused.
            for role in [AdminRole.reader, .investigator] {
                let made = try await server.admin.createToken(TokenRequest(name: "other-\(role.rawValue)", kind: .admin, role: role))
                let other = try AdminClient(server: server.adminURL, token: made.token)
                let refused = "admin started tail \(tail.id): they or an admin read its records"
                await #expect(throws: AdminClientError.forbidden(refused)) { try await other.tailFiles(tail.id) }
                await #expect(throws: AdminClientError.forbidden(refused)) {
                    try await other.download(tail: tail.id, file: again, to: server.dir.file("theirs/records.jsonl"))
                }
                #expect(!FileManager.default.fileExists(atPath: server.dir.file("theirs/records.jsonl")))
            }
            // A scoped engineer sees its own tails only: another's is no tail.
            let scoped = try await server.admin.createToken(
                TokenRequest(name: "scoped", kind: .admin, role: .investigator, scope: AccessScope(labels: ["region": "eu"])))
            await #expect(throws: AdminClientError.notFound("no tail \(tail.id)")) {
                try await AdminClient(server: server.adminURL, token: scoped.token).tailFiles(tail.id)
            }

            // A file at the download's place that is not the start of the listed one (edited by
            // hand, say): going on from it fails the check, and the file comes whole instead,
            // replacing it once checked.
            let edited = server.dir.file("edited/records.jsonl")
            try FileManager.default.createDirectory(atPath: server.dir.file("edited"), withIntermediateDirectories: true)
            try Data("my notes\n".utf8).write(to: URL(fileURLWithPath: edited))
            #expect(try await server.admin.download(tail: tail.id, file: again, to: edited) == .downloaded)
            #expect(try Data(contentsOf: URL(fileURLWithPath: edited)) == whole)
            #expect(!FileManager.default.fileExists(atPath: edited + ".part"))

            // Removed (marked so, as a removal does before it deletes the files): nothing listed,
            // nothing served, though the files are still there.
            _ = try await server.tails.markRemoved(tail.id, by: "admin", reason: "T-2", at: Date())
            #expect(FileManager.default.fileExists(atPath: tail.directory + "/" + TailFiles.records))
            #expect(try await server.admin.tailFiles(tail.id).isEmpty)
            await #expect(throws: AdminClientError.notFound("tail \(tail.id) has no file \"records.jsonl\" from agent \(Self.agent)")) {
                try await server.admin.download(tail: tail.id, file: again, to: server.dir.file("late/records.jsonl"))
            }
        }
    }

    @Test func theConsoleLinksAndServesWhatATailHeld() async throws {
        try await withStopping(InProcessServer()) { server in
            let tail = try await HeldTail(server)
            try await tail.hold(["<b>r1</b>", "r2"])
            let browser = ConsoleLiveTailTests.Browser(server.adminURL)
            do {
                try await browser.signIn(server.created.adminToken)
                let page = try await browser.send("/console/tails/\(tail.id)")
                #expect(page.body.contains(#"<a href="/console/tails/\#(tail.id)/files">Download what it held</a>"#))
                let files = try await browser.send("/console/tails/\(tail.id)/files")
                let href = "/console/tails/\(tail.id)/files/\(Self.agent)/records.jsonl"
                #expect(files.status == 200 && files.body.contains(#"href="\#(href)""#) && files.body.contains("contexts.jsonl"))
                #expect(files.body.contains(FileDigest.sha256(try tail.bytes(TailFiles.records))))
                let download = try await browser.send(href)
                let stored = String(decoding: try tail.bytes(TailFiles.records), as: UTF8.self)
                #expect(download.status == 200 && download.body == stored)
                // Once stopped, what it held is indexed.
                _ = try await server.admin.stopTail(tail.id, reason: "done")
                // (The stop has the indexer index it; it is searchable once that is done.)
                var found: [FoundRecord] = []
                for _ in 0..<6000 where found.isEmpty {
                    found = try await server.admin.search(RecordSearch(uid: "u-1", limit: 10)).records
                    if found.isEmpty { try await Task.sleep(for: .milliseconds(50)) }
                }
                let record = try #require(found.first)
                // A record the tail held names the tail's page (where its files are, for those who may).
                let recordPage = try await browser.send("/console/records/\(record.id)")
                #expect(recordPage.body.contains(#"<a href="/console/tails/\#(tail.id)"><code>\#(tail.id)</code></a>"#), "\(recordPage.body)")
                #expect(!recordPage.body.contains("Files of this tail"))
                try await browser.shutdown()
            } catch {
                try await browser.shutdown()
                throw error
            }
            // Another investigator sees the tail's page without the link, and is refused its files.
            let made = try await server.admin.createToken(TokenRequest(name: "other", kind: .admin, role: .investigator))
            let other = ConsoleLiveTailTests.Browser(server.adminURL)
            do {
                try await other.signIn(made.token)
                let theirs = try await other.send("/console/tails/\(tail.id)")
                #expect(theirs.status == 200 && !theirs.body.contains("Download what it held"))
                #expect(try await other.send("/console/tails/\(tail.id)/files").status == 403)
                #expect(try await other.send("/console/tails/\(tail.id)/files/\(Self.agent)/records.jsonl").status == 403)
                try await other.shutdown()
            } catch {
                try await other.shutdown()
                throw error
            }
        }
    }
}
