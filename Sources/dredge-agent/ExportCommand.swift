import ArgumentParser
import DredgeAgentCore
import DredgeCommandLine
import DredgeEnvelope
import DredgeExport
import DredgePayload
import Foundation

/// `dredge-agent export`: the zip a pull would upload, written locally for a developer at the
/// device; off unless the agent's configuration allows it.
struct ExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Write the selected records to a zip (per-day files and a manifest), or sealed to a public key.",
        discussion: """
            Disabled unless STATE/config.json has "allowManualExport": true (and with \
            "manualExportRequiresEncryption": true, only with --encrypt-to). A sealed file is opened \
            with `dredge open-export FILE --key PRIVATE.pem --out DIR`.
            """)

    @OptionGroup var agentState: AgentStateOptions
    @OptionGroup var store: StoreOptions
    @OptionGroup var selection: FilterOptions

    @Option(help: "The file to write (not overwritten if it exists).")
    var out: String

    @Option(help: "Seal the export to this RSA public key (PEM, SubjectPublicKeyInfo).")
    var encryptTo: String?

    func run() async throws {
        let configuration: AgentConfiguration
        do {
            configuration = try AgentConfiguration.load(stateDirectory: agentState.path)
        } catch let error as AgentError {
            throw fail(error.description)
        }
        guard configuration.allowManualExport else {
            throw fail("manual export is disabled on this device: set \"allowManualExport\": true in \(AgentConfiguration.path(stateDirectory: agentState.path))")
        }
        guard encryptTo != nil || !configuration.manualExportRequiresEncryption else {
            throw fail("this device allows manual exports only sealed to a public key: give --encrypt-to PEM")
        }
        guard !FileManager.default.fileExists(atPath: out) else { throw fail("\(out) exists; not overwriting it") }
        var recipient: RSAPublicKey?
        if let encryptTo {
            guard let pem = try? String(contentsOfFile: encryptTo, encoding: .utf8), let key = try? RSAPublicKey(pemRepresentation: pem) else {
                throw fail("\(encryptTo) is not an RSA public key in PEM")
            }
            recipient = key
        }
        let filter = try selection.filter()
        let logStore = try store.open(readOnly: true)
        defer { try? logStore.close() }
        let agentID = (try? AgentState.load(from: agentState.path))?.file.agentID ?? ""
        do {
            let manifest = try SealedExportFile.write(from: logStore, filter: filter, agentID: agentID, to: out, recipient: recipient)
            FileHandle.standardError.write(Data("wrote \(manifest.recordCount) records to \(out)\(recipient == nil ? "" : " (sealed)")\n".utf8))
        } catch let error as ExportError {
            throw fail(error.description)
        }
    }
}
