import ArgumentParser
import DredgeCommandLine
import DredgeEnvelope
import DredgePayload
import DredgeReception
import Foundation

/// `dredge open-export`: opens a sealed manual export (`dredge-agent export --encrypt-to`) with
/// the private key it was sealed to. Works offline; needs no server.
struct OpenExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "open-export",
        abstract: "Decrypt and unpack a sealed export from `dredge-agent export --encrypt-to` (no server needed).")

    @Argument(help: "The sealed export file.")
    var file: String

    @Option(help: "The RSA private key (PEM) the export was sealed to.")
    var key: String

    @Option(help: "Directory to create for the per-day files and the manifest.")
    var out: String

    func run() async throws {
        guard let pem = try? String(contentsOfFile: key, encoding: .utf8), let privateKey = try? RSAPrivateKey(pemRepresentation: pem) else {
            throw fail("\(key) is not an RSA private key in PEM")
        }
        guard !FileManager.default.fileExists(atPath: out) else { throw fail("\(out) exists; give a new directory") }
        do {
            let payload = try SealedExportFile.open(file, key: privateKey, into: out)
            for name in payload.files { print(out + "/" + (name as NSString).lastPathComponent) }
            print(out + "/manifest.json")
            Terminal.error("\(payload.manifest.recordCount) records, authentic and complete\n")
        } catch let error as ExportError {
            throw fail(error.description)
        }
    }
}
