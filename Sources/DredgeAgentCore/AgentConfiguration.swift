import Foundation

/// What the device's owner allows the agent to do, from `STATE/config.json` (optional; every
/// setting is off when the file or the key is absent). Production apps ship without it; a
/// development build or a developer at the device writes it.
///
/// ```json
/// {"allowManualExport": true, "manualExportRequiresEncryption": false}
/// ```
public struct AgentConfiguration: Codable, Sendable, Equatable {
    /// `dredge-agent export` may write the store's records to a file.
    public var allowManualExport: Bool
    /// … but only sealed to a public key (`--encrypt-to`).
    public var manualExportRequiresEncryption: Bool

    public init(allowManualExport: Bool = false, manualExportRequiresEncryption: Bool = false) {
        self.allowManualExport = allowManualExport
        self.manualExportRequiresEncryption = manualExportRequiresEncryption
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        allowManualExport = try c.decodeIfPresent(Bool.self, forKey: .allowManualExport) ?? false
        manualExportRequiresEncryption = try c.decodeIfPresent(Bool.self, forKey: .manualExportRequiresEncryption) ?? false
    }

    public static func path(stateDirectory: String) -> String { stateDirectory + "/config.json" }

    /// The configuration in `stateDirectory`; the defaults (everything off) if there is none.
    /// A file that cannot be read is an error, not the defaults.
    public static func load(stateDirectory: String) throws -> AgentConfiguration {
        let path = path(stateDirectory: stateDirectory)
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) { throw AgentError("cannot read \(path)") }
            return AgentConfiguration()
        }
        do {
            return try JSONDecoder().decode(AgentConfiguration.self, from: data)
        } catch {
            throw AgentError("\(path) is not valid: \(error)")
        }
    }
}
