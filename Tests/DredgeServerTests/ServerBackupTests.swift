import DredgeAdminAPI
import DredgeAgentCore
import DredgeDomain
import DredgePayload
@testable import DredgeServer
import DredgeTestSupport
import DredgeWire
import Foundation
import GRDB
import Testing

/// `dredge-server backup` and `restore` (#56): a backup taken while uploads run restores onto
/// another directory as the deployment stood at the database's snapshot, and every upload goes
/// on; a damaged or foreign backup is refused and nothing is written.
@Suite struct ServerBackupTests {
    /// Chunks of pull 2 sent before the backup: the restored server holds exactly these.
    static let before: UInt32 = 3

    @Test func aBackupTakenDuringUploadsRestoresElsewhereAndEveryUploadGoesOn() async throws {
        let place = TempDir()
        let backup = place.file("backup")
        var created: ServerDeployment.Created!
        var agents: (a: LinkAgent, b: LinkAgent)!
        var pulls: (complete: String, halfSent: String, landedAfter: String) = ("", "", "")
        var halfUpload: SealedUpload!
        var store = ""
        var manifest: ServerBackup.Manifest!
        var digests: [String: String] = [:]

        try await withStopping(InProcessServer()) { server in
            created = server.created
            store = try server.deviceStore()
            let a = try await server.enrollAgent(hostname: "a"), b = try await server.enrollAgent(hostname: "b")
            agents = (a, b)
            // Pull 1 lands and is indexed before the backup.
            pulls.complete = try await server.queuePull(agentID: a.agentID)
            try await a.connect { link in
                let command = try await LinkAgent.acceptNextPull(over: link)
                let outcome = try await LinkAgent.send(try a.pullUpload(command, store: store, dir: server.dir), over: link)
                #expect(outcome.result.ok, "\(outcome)")
            }
            try await RecordSearchTests.indexed(server.indexer)
            #expect(try await server.records.search(RecordSearch(pull: pulls.complete)).records.count > 0)
            for file in try await server.admin.pullFiles(pulls.complete) { digests[file.name] = file.sha256 }

            // Pull 2: A sends its first chunks (acknowledged), then the backup runs; pull 3: B's
            // whole upload lands and is indexed between the database's snapshot and the rest.
            pulls.halfSent = try await server.queuePull(agentID: a.agentID)
            pulls.landedAfter = try await server.queuePull(agentID: b.agentID)
            try await a.connect { link in
                let command = try await LinkAgent.acceptNextPull(over: link)
                let upload = try a.pullUpload(command, store: store, dir: server.dir, chunkSize: WireLimits.minChunkBytes)
                halfUpload = upload
                let count = upload.header.chunkCount
                try #require(count > Self.before + 1, "chunks before and after the backup")
                try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                #expect(try await LinkAgent.answer(to: command.commandID, over: link)?.uploadReady.uploadID == command.commandID)
                for index in 0..<Self.before { try await Self.sendChunk(index, of: upload, over: link) }
                for _ in 0..<Self.before {
                    let answer = try #require(try await LinkAgent.answer(to: command.commandID, over: link))
                    guard case .chunkAck? = answer.body else { throw AgentError("not an acknowledgement: \(answer)") }
                }

                let (landedAfter, store) = (pulls.landedAfter, store)
                manifest = try await ServerBackup.make(data: server.data, to: backup) {
                    try await b.connect { linkB in
                        let command = try await LinkAgent.acceptNextPull(over: linkB)
                        #expect(command.commandID == landedAfter)
                        let outcome = try await LinkAgent.send(try b.pullUpload(command, store: store, dir: server.dir), over: linkB)
                        #expect(outcome.result.ok, "\(outcome)")
                    }
                    try await RecordSearchTests.indexed(server.indexer)
                    #expect(try await server.records.search(RecordSearch(pull: landedAfter)).records.count > 0)
                    // Its chunks go once its result is out: gone before the backup reads on.
                    let chunks = try DataDirectory(server.data).upload(landedAfter, agent: b.agentID)
                    for _ in 0..<1500 where FileManager.default.fileExists(atPath: chunks) { try await Task.sleep(for: .milliseconds(20)) }
                    #expect(!FileManager.default.fileExists(atPath: chunks))
                }

                // Without the files (`--no-files`): the same database and index, no pulled file.
                let bare = try await ServerBackup.make(data: server.data, to: place.file("bare"), includeFiles: false)
                #expect(!bare.includesFiles && bare.counts.pulledFiles == 0 && bare.counts.completeTargets == 2)
                #expect(!bare.files.contains { $0.path.hasPrefix("pulls/") || $0.path.hasPrefix("feedback/") }, "\(bare.files.map(\.path))")
                #expect(bare.files.contains { $0.path == SQLiteRecordIndex.fileName } && bare.counts.indexSourcesLeftOut == 0)

                // The rest of pull 2 after the backup: acknowledged now, so not in it.
                for index in Self.before..<count { try await Self.sendChunk(index, of: upload, over: link) }
                try await link.send(.with { $0.uploadComplete = .with { $0.uploadID = command.commandID } })
                var result: WireUploadResult?
                while result == nil, let answer = try await LinkAgent.answer(to: command.commandID, over: link) {
                    if case .uploadResult(let r)? = answer.body { result = r }
                }
                #expect(result?.ok == true, "\(String(describing: result))")
            }
        }

        // What the backup says it holds: the snapshot's view, not what came after.
        #expect(manifest.counts.agents == 2 && manifest.counts.pulls == 3 && manifest.counts.completeTargets == 1)
        #expect(manifest.counts.uploadsInProgress == 2 && manifest.counts.chunks == Int(Self.before))
        #expect(manifest.counts.indexSourcesLeftOut == 1, "pull 3's records, indexed after the snapshot")
        #expect(manifest.includesFiles && manifest.counts.pulledFiles == digests.count, "\(manifest.files.map(\.path))")
        #expect(Set(manifest.files.map(\.path)).isSuperset(of: ServerDeployment.files))
        #expect(!manifest.files.contains { $0.path.contains(pulls.landedAfter) }, "\(manifest.files.map(\.path))")
        #expect(try ServerBackup.verify(backup) == manifest)
        var info = stat()
        #expect(stat(backup, &info) == 0 && info.st_mode & 0o777 == 0o700)
        #expect(stat(backup + "/signing-key", &info) == 0 && info.st_mode & 0o777 == 0o600)

        // Restored onto another path (another host's), it runs as it stood.
        let restored = place.file("elsewhere/data")
        #expect(try await ServerBackup.restore(from: backup, to: restored) == manifest)
        try await withStopping(InProcessServer(dataDirectory: restored, existing: created)) { server in
            #expect(Set(try await server.registry.agents().map(\.agentID)) == [agents.a.agentID, agents.b.agentID])
            // Pull 1: complete, its files downloadable as they were, its records searchable.
            let one = try #require(try await server.pulls.pull(pulls.complete))
            #expect(one.targets.first?.status == .complete)
            let files = try await server.admin.pullFiles(pulls.complete)
            #expect(Dictionary(uniqueKeysWithValues: files.map { ($0.name, $0.sha256) }) == digests)
            let manifestFile = try #require(files.first { $0.kind == .manifest })
            _ = try await server.admin.download(pull: pulls.complete, file: manifestFile, to: place.file("manifest.json"))
            #expect(try BackupCopier.digest(place.file("manifest.json")).1 == manifestFile.sha256)
            try await RecordSearchTests.indexed(server.indexer)
            let records = try await server.records.search(RecordSearch(pull: pulls.complete)).records.count
            #expect(records > 0)
            // Pull 3 landed after the snapshot: in progress again, nothing of it searchable.
            #expect(try await server.pulls.pull(pulls.landedAfter)?.targets.first?.status.isFinal == false)
            #expect(try await server.records.search(RecordSearch(pull: pulls.landedAfter)).records.isEmpty)

            let a = LinkAgent(server: server, tls: agents.a.tls, key: agents.a.key, agentID: agents.a.agentID, hostInfo: agents.a.hostInfo)
            let b = LinkAgent(server: server, tls: agents.b.tls, key: agents.b.key, agentID: agents.b.agentID, hostInfo: agents.b.hostInfo)
            // Pull 2 resumes from the chunks the backup holds: the agent sends only the rest.
            try await a.connect { link in
                let upload: SealedUpload = halfUpload
                let count = upload.header.chunkCount
                try await link.send(.with { $0.uploadBegin = .with { $0.header = upload.header } })
                let ready = try #require(try await LinkAgent.answer(to: pulls.halfSent, over: link))
                guard case .uploadReady(let r)? = ready.body else { throw AgentError("not ready: \(ready)") }
                #expect(ChunkBitmap.decode(r.received, count: count) == Set(0..<Self.before))
                for index in Self.before..<count { try await Self.sendChunk(index, of: upload, over: link) }
                try await link.send(.with { $0.uploadComplete = .with { $0.uploadID = upload.header.uploadID } })
                var result: WireUploadResult?
                while result == nil, let answer = try await LinkAgent.answer(to: pulls.halfSent, over: link) {
                    if case .uploadResult(let r)? = answer.body { result = r }
                }
                #expect(result?.ok == true, "\(String(describing: result))")
            }
            // Pull 3: B, which still has it, sends it again.
            try await b.connect { link in
                let command = try await LinkAgent.acceptNextPull(over: link)
                #expect(command.commandID == pulls.landedAfter)
                let outcome = try await LinkAgent.send(try b.pullUpload(command, store: store, dir: server.dir), over: link)
                #expect(outcome.result.ok, "\(outcome)")
            }
            try await RecordSearchTests.indexed(server.indexer)
            for pull in [pulls.halfSent, pulls.landedAfter] {
                #expect(try await server.pulls.pull(pull)?.targets.first?.status == .complete)
                #expect(try await server.records.search(RecordSearch(pull: pull)).records.count == records)
            }
        }
    }

    static func sendChunk(_ index: UInt32, of upload: SealedUpload, over link: AgentLink) async throws {
        try await link.send(.with { $0.uploadChunk = .with { $0.uploadID = upload.header.uploadID; $0.index = index; $0.ciphertext = Data(try! upload.chunk(index)) } })
    }

    /// A backup made with no server running, for the refusals below.
    static func backedUp(_ place: TempDir) async throws -> (data: String, backup: String) {
        let data = place.file("data"), backup = place.file("backup")
        _ = try ServerDeployment.initialize(ServerDeployment.Options(dataDirectory: data))
        _ = try await ServerBackup.make(data: data, to: backup)
        return (data, backup)
    }

    @Test func aDamagedBackupIsRefusedAndNothingIsWritten() async throws {
        let place = TempDir()
        let (_, backup) = try await Self.backedUp(place)
        let target = place.file("restored")
        // One byte of a key changed.
        var key = try Data(contentsOf: URL(fileURLWithPath: backup + "/signing-key"))
        key[0] ^= 1
        try key.write(to: URL(fileURLWithPath: backup + "/signing-key"))
        #expect(throws: DeploymentError.self) { try ServerBackup.verify(backup) }
        let error = try await #require(throws: DeploymentError.self) { try await ServerBackup.restore(from: backup, to: target) }
        #expect(error.description.contains("signing-key is not the file the backup made"), "\(error)")
        #expect(!FileManager.default.fileExists(atPath: target))
        #expect(try FileManager.default.contentsOfDirectory(atPath: place.path).allSatisfy { !$0.contains(".restoring-") })
    }

    @Test func aMissingFileAPathOutsideAndANewerSchemaAreRefused() async throws {
        let place = TempDir()
        let (_, backup) = try await Self.backedUp(place)
        let manifestPath = backup + "/" + ServerBackup.manifestName
        let original = try Data(contentsOf: URL(fileURLWithPath: manifestPath))
        func rewrite(_ change: (inout [String: Any]) -> Void) throws {
            var json = try #require(try JSONSerialization.jsonObject(with: original) as? [String: Any])
            change(&json)
            try JSONSerialization.data(withJSONObject: json).write(to: URL(fileURLWithPath: manifestPath))
        }
        func refusal() async throws -> String {
            let error = try await #require(throws: DeploymentError.self) { try await ServerBackup.restore(from: backup, to: place.file("restored")) }
            #expect(!FileManager.default.fileExists(atPath: place.file("restored")))
            return error.description
        }
        try rewrite { json in
            var files = json["files"] as! [[String: Any]]
            files[0]["path"] = "../outside"
            json["files"] = files
        }
        #expect(try await refusal().contains("not a plain relative one"))
        try rewrite { json in json["files"] = (json["files"] as! [[String: Any]]).filter { $0["path"] as? String != "ca-key.pem" } }
        #expect(try await refusal().contains("lacks ca-key.pem"))
        try rewrite { json in json["migrations"] = (json["migrations"] as! [String]) + ["from-the-future"] }
        #expect(try await refusal().contains("schema steps this release does not know (from-the-future)"))
        try rewrite { json in json["format"] = ServerBackup.format + 1 }
        #expect(try await refusal().contains("newer Dredge"))
        try FileManager.default.removeItem(atPath: manifestPath)
        #expect(try await refusal().contains("not a backup"))
    }

    @Test func nothingIsOverwrittenAndTheBackupStaysOutsideTheDataDirectory() async throws {
        let place = TempDir()
        let (data, backup) = try await Self.backedUp(place)
        // The backup is not overwritten by another.
        let again = try await #require(throws: DeploymentError.self) { try await ServerBackup.make(data: data, to: backup) }
        #expect(again.description.contains("never overwrites"))
        let inside = try await #require(throws: DeploymentError.self) { try await ServerBackup.make(data: data, to: data + "/backup") }
        #expect(inside.description.contains("outside the data directory"))
        // A data directory is not restored over, and is left as it was.
        let before = InProcessServer.snapshot(data)
        let over = try await #require(throws: DeploymentError.self) { try await ServerBackup.restore(from: backup, to: data) }
        #expect(over.description.contains("not an empty directory"))
        #expect(InProcessServer.snapshot(data) == before)
        // Not a deployment.
        let none = try await #require(throws: DeploymentError.self) { try await ServerBackup.make(data: place.file("nothing"), to: place.file("b2")) }
        #expect(none.description.contains("missing"), "\(none)")
        // An empty directory is a fine target; the restored one verifies as the backup did.
        let empty = place.file("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
        _ = try await ServerBackup.restore(from: backup, to: empty)
        #expect(try LoadedDeployment(directory: empty).config.agentPort == (try LoadedDeployment(directory: data).config.agentPort))
        #expect(try FileManager.default.contentsOfDirectory(atPath: place.path).allSatisfy { !$0.contains(".partial-") && !$0.contains(".restoring-") })
    }
}
