import Foundation

/// Where records come from: the host, the OS, the app and its version, the process, and anything
/// the app adds. Two equal contexts share one row.
public struct LogContext: Hashable, Sendable, Codable {
    public var host: String
    public var os: String
    public var app: String
    public var appVersion: String
    public var process: String
    public var extra: [String: String]

    public init(host: String, os: String, app: String, appVersion: String, process: String, extra: [String: String] = [:]) {
        self.host = host
        self.os = os
        self.app = app
        self.appVersion = appVersion
        self.process = process
        self.extra = extra
    }

    enum CodingKeys: String, CodingKey { case host, os, app, appVersion, process, extra }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        host = try c.decode(String.self, forKey: .host)
        os = try c.decode(String.self, forKey: .os)
        app = try c.decode(String.self, forKey: .app)
        appVersion = try c.decode(String.self, forKey: .appVersion)
        process = try c.decode(String.self, forKey: .process)
        extra = try c.decodeIfPresent([String: String].self, forKey: .extra) ?? [:]
    }
}

extension LogContext {
    /// The context of the running process: host name, kernel, and the executable's name as the app.
    public static func current(app: String? = nil, appVersion: String = "unknown", extra: [String: String] = [:]) -> LogContext {
        let info = ProcessInfo.processInfo
        return LogContext(
            host: info.hostName,
            os: "\(info.operatingSystemVersionString)",
            app: app ?? info.processName,
            appVersion: appVersion,
            process: "\(info.processName)[\(info.processIdentifier)]",
            extra: extra)
    }
}
