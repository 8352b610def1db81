import DredgeAdminAPI
import DredgeDomain
import DredgeEnvelope
import DredgePayload
import DredgeReception
import DredgeWire
import Foundation
import Logging
import NIOPosix

/// An upload's last steps, once its last chunk is in: the manifest checked against the pull,
/// the feedback or the capture it answers, the files put in place (what streaming unpacked, else the whole zip,
/// else, after a restart, what is already there if it is this upload's), the zip kept beside
/// them, and the status recorded complete. A payload that breaks the rules fails the upload for
/// good; the server's own trouble (disk, I/O) leaves it open for the agent to finish later.
struct UploadFinisher: Sendable {
    /// How an upload ended: the result to send the agent and, when it landed, its chunk
    /// directory, to remove once the result is on its way.
    struct Finished {
        var result: WireUploadResult
        var landedChunks: String?
    }

    let agentID: String
    let services: ConnectionServices
    let statuses: UploadStatuses
    let limits: PayloadLimits

    private var pulls: any PullQueue { services.pulls }
    private var feedback: any FeedbackInbox { services.feedback }
    private var paths: DataDirectory { services.paths }
    private var feedbackLimits: FeedbackLimits { services.feedbackLimits }
    private var blocking: NIOThreadPool { services.work.uploads }
    private var logger: Logger { services.logger }
    /// Told of each upload whose files are in place and recorded complete (the ``Indexer``).
    private var landed: @Sendable (IndexedSource, _ records: Int) -> Void { services.landed }

    /// The directory an upload's files go to: `pulls/<pull>/<agent>/`, `feedback/<id>/` or
    /// `captures/<id>/`.
    private func destination(_ uploadID: String, _ owner: UploadOwner) throws -> String {
        switch owner {
        case .pull: try paths.pullFiles(uploadID, agent: agentID)
        case .feedback: try paths.feedbackFiles(uploadID)
        case .capture: try paths.captureFiles(uploadID)
        }
    }

    /// Where an upload's zip is kept beside its files.
    private func zipCopy(_ uploadID: String, _ owner: UploadOwner) throws -> String {
        switch owner {
        case .pull: try paths.pullZip(uploadID, agent: agentID)
        case .feedback: try paths.feedbackZip(uploadID)
        case .capture: try paths.captureZip(uploadID)
        }
    }

    /// Reassembles, decrypts, unpacks with limits into the upload's directory (``destination(_:_:)``).
    /// A failure of the server's own (disk, I/O) leaves the upload open for the agent to finish
    /// later; a payload that breaks the rules fails it for good.
    func finish(_ uploadID: String, _ assembler: UploadAssembler, _ owner: UploadOwner) async -> Finished {
        let what = owner.name
        let kind = owner.metricsKind
        do {
            // What the manifest must say was selected (Protocol § Payload).
            var selection: LogFilter?
            if owner == .pull {
                guard let pull = try await pulls.pull(uploadID), let target = pull.targets.first(where: { $0.agentID == agentID }) else {
                    throw ExportError(.uploadInvalid, "no pull \(uploadID) for this agent")
                }
                if target.status.isFinal {
                    throw ExportError(.uploadInvalid, "pull \(uploadID) is already \(target.status.rawValue): \(target.detail)")
                }
                guard let filter = pull.filter else { throw ExportError(.uploadInvalid, "pull \(uploadID)'s stored filter does not read back") }
                selection = filter.bounded(toTarget: pull.uid)
            }
            let destination = try destination(uploadID, owner)
            let selected = selection
            let payload = try await blocking.runIfActive {
                try self.unpack(uploadID, assembler, into: destination, owner, selection: selected)
            }
            let files = (payload.files.map { ($0 as NSString).lastPathComponent } + [PayloadLimits.manifestName]).map { destination + "/" + $0 }
            guard try await statuses.move(uploadID, owner, to: .complete, detail: "\(payload.manifest.recordCount) records", records: payload.manifest.recordCount, files: files) else {
                // Ended meanwhile (expired by the deadline sweep, removed by an engineer): the
                // agent must not believe it arrived, and the files just put in place go.
                // (Unless another connection of this agent landed the same upload meanwhile.)
                let placed = [destination, try zipCopy(uploadID, owner)]
                do {
                    let complete = try await statuses.recorded(uploadID) == .complete
                    if !complete { _ = try await blocking.runIfActive { try ResultsKeeper.delete(placed) } }
                } catch {
                    logger.error("could not delete the files of an upload that ended before it landed", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                }
                throw ExportError(.uploadInvalid, "\(what) \(uploadID) ended before its upload finished")
            }
            landed(IndexedSource(kind: owner.indexedKind, id: uploadID, agentID: agentID), payload.manifest.recordCount)
            services.metrics.uploadFinished(kind, .complete)
            let chunks = try paths.inside(assembler.directory)
            logger.info("\(what) complete", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "records": "\(payload.manifest.recordCount)"])
            return Finished(
                result: .with { $0.uploadID = uploadID; $0.ok = true; $0.files = UInt32(payload.files.count); $0.records = UInt64(payload.manifest.recordCount) },
                landedChunks: chunks)
        } catch {
            let final: (WireErrorCode, String)? =
                switch (error as? ExportError)?.code {
                case .payloadInvalid?: (.errorPayloadInvalid, "\(error)")
                case .uploadInvalid?, .chunkAuthFailed?, .exists?: (.errorUploadInvalid, "\(error)")
                default: nil
                }
            if let (code, detail) = final {
                do {
                    try await statuses.move(uploadID, owner, to: .failed, detail: detail, failedWith: code)
                } catch {
                    logger.error("could not record a failed upload", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                }
                services.metrics.uploadFinished(kind, .failed)
                logger.error("\(what) failed", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
                return Finished(result: .with { $0.uploadID = uploadID; $0.ok = false; $0.error = code; $0.detail = detail })
            }
            do {
                try await statuses.move(uploadID, owner, to: .uploading, detail: "the server could not unpack it (\(error)); the agent will retry")
            } catch {
                logger.error("could not record an upload's trouble", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
            }
            services.metrics.uploadFinished(kind, .retry)
            logger.error("\(what) could not be unpacked; left for the agent to retry", metadata: ["upload.id": "\(uploadID)", "agent.id": "\(agentID)", "error": "\(error)"])
            return Finished(result: .with { $0.uploadID = uploadID; $0.ok = false; $0.error = .errorInternal; $0.detail = "the server could not store the upload now; try later" })
        }
    }

    /// An upload's files in place (blocking): what streaming unpacked, checked and moved; else
    /// the whole zip reassembled and unpacked; else (unpacked before a restart) adopted. The zip
    /// is kept beside the files.
    private func unpack(
        _ uploadID: String, _ assembler: UploadAssembler, into destination: String, _ owner: UploadOwner, selection: LogFilter?
    ) throws -> ExtractedPayload {
        let zipCopy = try zipCopy(uploadID, owner)
        try FileManager.default.createDirectory(atPath: (destination as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let check = { (manifest: ExportManifest) throws in
            guard manifest.uploadID == uploadID, manifest.kind == owner.name, manifest.agentID == self.agentID else {
                throw ExportError(.payloadInvalid, "the manifest describes another upload (\(manifest.kind) \(manifest.uploadID) of agent \(manifest.agentID))")
            }
            let header = assembler.header
            guard manifest.empty == header.empty else {
                throw ExportError(.payloadInvalid, "the header says empty=\(header.empty) but the manifest says empty=\(manifest.empty)")
            }
            switch owner {
            case .capture:
                try Self.checkCapture(manifest, header.capture)
            case .feedback:
                guard let described = manifest.feedback, described.feedbackID == header.feedback.feedbackID, described.uid == header.feedback.uid,
                    described.text == header.feedback.text, described.createdAt == Timestamp(microseconds: header.feedback.createdAtUs).rfc3339
                else { throw ExportError(.payloadInvalid, "the manifest's feedback differs from the upload header's") }
                let f = manifest.filter
                guard f.uid == header.feedback.uid, f.since != nil, f.until != nil, (f.types ?? []).isEmpty, (f.levels ?? []).isEmpty, (f.text ?? "").isEmpty else {
                    throw ExportError(.payloadInvalid, "a feedback's manifest selects its uid in a time range and nothing else")
                }
            case .pull:
                guard manifest.commandID == uploadID else {
                    throw ExportError(.payloadInvalid, "the manifest names command \(manifest.commandID ?? "none"), not \(uploadID)")
                }
                if let selection {
                    let described: LogFilter
                    do {
                        described = try manifest.filter.logFilter()
                    } catch {
                        throw ExportError(.payloadInvalid, "the manifest's filter does not read: \(error)")
                    }
                    if described.normalized != selection.normalized {
                        throw ExportError(.payloadInvalid, "the manifest's filter is not the pull's (\(Self.describe(described)) instead of \(Self.describe(selection)))")
                    }
                }
            }
        }
        var zip = ""
        var payload: ExtractedPayload?
        do {
            // Unpacked while it arrived: what is left is the held chunks a resumed upload's
            // stream has not caught up with yet, checking the manifest and moving the files
            // into place. If that did not work out, the whole zip is unpacked below, which decides.
            assembler.catchUp()
            if assembler.streamedEverything, let stream = assembler.stream {
                defer { assembler.endStream() }
                do {
                    payload = try stream.finish(into: destination, check: check)
                    zip = stream.zipPath
                } catch let error as ExportError where error.code == .exists {
                    zip = stream.zipPath
                    throw error
                } catch {
                    logger.notice("unpacking while receiving did not finish; unpacking the whole zip", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
                    stream.discard()
                }
            } else if let stream = assembler.stream {
                logger.notice("unpacking while receiving stopped; unpacking the whole zip", metadata: ["upload.id": "\(uploadID)", "error": "\(stream.failure.map { "\($0)" } ?? "")"])
                stream.discard()
                assembler.endStream()
            }
            if payload == nil {
                // A name of this connection's own: an older connection of the same agent
                // may still be finishing the same upload.
                zip = try paths.inside(assembler.directory + "/payload-" + Hex.encode(secureRandomBytes(4)) + ".zip")
                try assembler.assemble(to: zip)
                payload = try PayloadExtractor.extract(
                    zip: zip, into: destination, limits: owner == .pull ? limits : feedbackLimits.payloadLimits(within: limits), check: check)
            }
        } catch let error as ExportError where error.code == .exists {
            // Unpacked before, and the server stopped before recording it: adopt it if it is
            // this upload's; never replace it.
            payload = try adopt(destination, uploadID: uploadID, owner, error: error)
        }
        guard let payload else { throw ExportError(.io, "no payload") }
        do {
            if !zip.isEmpty && FileManager.default.fileExists(atPath: zip) {
                if FileManager.default.fileExists(atPath: zipCopy) { try FileManager.default.removeItem(atPath: zipCopy) }
                try FileManager.default.moveItem(atPath: zip, toPath: zipCopy)
            }
        } catch {
            logger.warning("could not keep the zip beside the files", metadata: ["upload.id": "\(uploadID)", "error": "\(error)"])
        }
        return payload
    }

    /// A capture's manifest says what its header says (Protocol § 21, *The payload*): the
    /// trigger, the set version, crash, the time of the match and (unless a crash) the record
    /// that fired it at that time; its filter is the window and the header's uid, and nothing else.
    static func checkCapture(_ manifest: ExportManifest, _ header: WireCapture) throws {
        guard let described = manifest.capture, manifest.commandID == nil, manifest.feedback == nil else {
            throw ExportError(.payloadInvalid, "a capture's manifest describes its capture, and no command or feedback")
        }
        let matchedAt = Timestamp(microseconds: header.matchedAtUs).rfc3339
        guard described.triggerID == header.triggerID, described.setVersion == header.setVersion, described.crash == header.crash, described.matchedAt == matchedAt
        else { throw ExportError(.payloadInvalid, "the manifest's capture differs from the upload header's") }
        if header.crash {
            guard described.match == nil else { throw ExportError(.payloadInvalid, "a crash capture's manifest names no record that matched") }
        } else {
            guard case .object(let record)? = described.match, record["ts"] == .string(matchedAt) else {
                throw ExportError(.payloadInvalid, "a capture's manifest names the record that fired it, logged at matched_at")
            }
            // Of the capture's user, when it names one (§ 13: no record of another uid is kept).
            if !header.uid.isEmpty, record["uid"] != .string(header.uid) {
                throw ExportError(.payloadInvalid, "the record that fired a capture of \(header.uid) is another user's")
            }
        }
        let f = manifest.filter
        let uid: String? = header.uid.isEmpty ? nil : header.uid
        guard f.since == Timestamp(microseconds: header.sinceUs).rfc3339, f.until == Timestamp(microseconds: header.untilUs).rfc3339, f.uid == uid,
            (f.types ?? []).isEmpty, (f.levels ?? []).isEmpty, (f.text ?? "").isEmpty
        else { throw ExportError(.payloadInvalid, "a capture's manifest selects its window and its uid, and nothing else") }
    }

    private static func describe(_ f: LogFilter) -> String {
        ConnectionUploads.bounded("uid \(f.uid.map(\.debugDescription) ?? "any") " + f.summary(time: \.rfc3339))
    }


    /// A destination that already exists is this upload's finished result only if its manifest
    /// says so (same upload, kind and agent); anything else is refused and left alone.
    private func adopt(_ destination: String, uploadID: String, _ owner: UploadOwner, error: ExportError) throws -> ExtractedPayload {
        guard let bytes = FileManager.default.contents(atPath: destination + "/" + PayloadLimits.manifestName),
            let manifest = try? JSONDecoder().decode(ExportManifest.self, from: bytes),
            manifest.uploadID == uploadID, manifest.agentID == agentID, manifest.kind == owner.name
        else { throw error }
        return ExtractedPayload(manifest: manifest, files: manifest.days.map { destination + "/" + $0.file }.sorted(), directory: destination)
    }
}
