import Foundation

/// A fresh directory under the system temp dir, removed when the value is released.
public final class TempDir: @unchecked Sendable {
    public let url: URL
    public var path: String { url.path }

    public init() {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("dredge-test-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    public func file(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// The path of an executable built beside the test bundle (`swift build --build-tests` builds
/// every product into the same directory).
public func builtProduct(_ name: String) -> String {
    var dir = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
    while dir.path != "/" {
        let candidate = dir.appendingPathComponent(name).path
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        dir = dir.deletingLastPathComponent()
    }
    return name
}
