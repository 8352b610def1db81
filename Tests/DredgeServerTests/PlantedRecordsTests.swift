import Crypto
import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
@testable import DredgeExport
import DredgePayload
import DredgeReception
import DredgeSamples
import DredgeStore
import DredgeTestSupport
import DredgeWire
import Foundation
import Testing
@testable import DredgeServer

/// #49: an enrolled agent could plant records in another user's timeline. Asked for one uid,
/// it answered with records of another and a context naming a real device's host; both were
/// indexed as they came, and the engineer read them as the victim's. Now a source's records
/// must carry the uid that was asked for (others are never indexed), and the device a record is
/// shown under is the one the registry holds for the uploading agent, with what the payload
/// claimed beside it. Through the real wire protocol and admin API.
@Suite struct PlantedRecordsTests {
    /// The export at `zip` with every day file changed by `change`, zipped again as an agent
    /// zips (the manifest as it was).
    static func rewritten(_ zip: String, dir: TempDir, _ change: (inout String) -> Void) throws -> String {
        let unpacked = dir.file("unpacked-\(UUID().uuidString)")
        let payload = try PayloadExtractor.extract(zip: zip, into: unpacked)
        let path = dir.file("forged-\(UUID().uuidString).zip")
        let writer = try ZipWriter(path: path, level: 6, workers: 1, modified: .now)
        for day in payload.manifest.days {
            var text = try String(contentsOfFile: unpacked + "/" + day.file, encoding: .utf8)
            change(&text)
            try writer.beginEntry(day.file)
            try writer.write(Array(text.utf8))
            try writer.endEntry()
        }
        try writer.beginEntry(PayloadLimits.manifestName)
        try writer.write(Array(try Data(contentsOf: URL(fileURLWithPath: unpacked + "/" + PayloadLimits.manifestName))))
        try writer.endEntry()
        _ = try writer.finish()
        return path
    }

    /// Every other record of `asked` made a record of `victim` (uids of one length, so the
    /// manifest's byte counts still hold). Returns how many were changed.
    static func plant(_ text: inout String, asked: String, victim: String) -> Int {
        var changed = 0
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).enumerated().map { n, line -> Substring in
            guard n % 2 == 0, line.contains("\"uid\":\"\(asked)\"") else { return line }
            changed += 1
            return Substring(line.replacingOccurrences(of: "\"uid\":\"\(asked)\"", with: "\"uid\":\"\(victim)\""))
        }
        text = lines.joined(separator: "\n")
        return changed
    }

    /// A store whose records, of `uid` only, name `host` in their context.
    static func store(_ path: String, host: String, uid: String) throws -> String {
        let (store, context) = try PullEndToEndTests.openDeviceStore(path, host: host)
        let now = Timestamp.now
        for entry in SampleLogs(count: 400, uids: [uid], from: now.subtracting(.seconds(3_600)), to: now, context: context) { store.enqueue(entry) }
        try store.close()
        return path
    }

    @Test func recordsOfAnotherUserAreNotIndexedAndTheDeviceIsTheRegisteredOne() async throws {
        try await withStopping(InProcessServer()) { server in
            // The victim: host oven-7, holding u-1, pulled honestly.
            let victim = try await server.enrollAgent(hostname: "oven-7")
            let victimStore = try server.deviceStore()
            let honestPull = try await victim.connect { link in
                _ = try await server.admin.createPull(PullRequest(uid: "u-1", agent: victim.agentID, filter: .all))
                return try await HostileAgentTests.completePull(victim, link: link, store: victimStore, dir: server.dir)
            }
            // The attacker: registered as host "rogue", its records name oven-7 in their context.
            let attacker = try await server.enrollAgent(hostname: "rogue")
            let attackerStore = try Self.store(server.dir.file("rogue.sqlite"), host: "oven-7", uid: "u-9")
            var planted = 0
            let (forgedPull, feedbackID) = try await attacker.connect { link in
                // Acked: its uids are committed (a pull made before the ack could miss it).
                #expect(try await LinkAgent.heartbeatAcked(["u-9"], over: link))
                // A pull by uid alone reaches the one agent holding u-9.
                let pull = try await server.admin.createPull(PullRequest(uid: "u-9", agent: nil, filter: .all))
                #expect(pull.targets.map(\.agentID) == [attacker.agentID])
                let command = try await LinkAgent.acceptNextPull(over: link)
                let upload = try attacker.pullUpload(command, store: attackerStore, dir: server.dir) { zip in
                    try Self.rewritten(zip, dir: server.dir) { planted += Self.plant(&$0, asked: "u-9", victim: "u-1") }
                }
                let outcome = try await LinkAgent.send(upload, over: link)
                #expect(outcome.result.ok, "\(outcome)")
                // Unsolicited feedback for u-9 whose records say u-2 (a victim's uid of the same length).
                let id = Hex.encode(secureRandomBytes(16))
                let feedback = try attacker.feedbackUpload(id: id, uid: "u-9", store: attackerStore, dir: server.dir) { zip in
                    try Self.rewritten(zip, dir: server.dir) { planted += Self.plant(&$0, asked: "u-9", victim: "u-2") }
                }
                let sent = try await LinkAgent.send(feedback, over: link)
                #expect(sent.result.ok, "\(sent)")
                return (command.commandID, id)
            }
            #expect(planted > 100)
            try await RecordSearchTests.indexed(server.indexer)

            // u-1 on oven-7: only the victim's records, none of the attacker's.
            let victims = try await RecordSearchTests.all(server.admin, RecordSearch(uid: "u-1", hosts: ["oven-7"], limit: 1000))
            #expect(!victims.isEmpty)
            #expect(victims.allSatisfy { $0.agentID == victim.agentID && $0.sourceID == honestPull }, "\(victims.filter { $0.agentID != victim.agentID }.count) planted")
            for uid in ["u-1", "u-2"] {
                let found = try await RecordSearchTests.all(server.admin, RecordSearch(uid: uid, agents: [attacker.agentID], limit: 1000))
                #expect(found.isEmpty, "\(found.count) records of \(uid) indexed from the attacker")
            }
            // What was asked for is there, shown under the registered host with the claim beside it.
            for source in [RecordSearch(pull: forgedPull, limit: 1000), RecordSearch(feedback: feedbackID, limit: 1000)] {
                let kept = try await RecordSearchTests.all(server.admin, source)
                #expect(!kept.isEmpty)
                #expect(kept.allSatisfy { $0.uid == "u-9" && $0.host == "rogue" && $0.claimedHost == "oven-7" && $0.hostShown == "rogue (claims oven-7)" })
            }
            // A search by the claimed host finds none of them; the victim's own carry no claim.
            #expect(try await RecordSearchTests.all(server.admin, RecordSearch(hosts: ["oven-7"], limit: 5000)).allSatisfy { $0.agentID == victim.agentID })
            #expect(victims.allSatisfy { $0.claimedHost == nil })
            // The operator is told.
            let told = server.logs.records.filter { $0.message == "records of another user than the one asked for were left out of the index" }
            #expect(told.count == 2)
            #expect(told.compactMap { $0.metadata["records"].flatMap { Int("\($0)") } }.reduce(0, +) == planted)
        }
    }
}
