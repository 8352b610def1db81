import DredgeDomain
import DredgeStore
import Foundation

/// Prints every record to stderr as well as storing it, while developing: one line per record,
/// coloured by level. Off unless a center is given one (`LogCenter(path:…, echo: ConsoleEcho())`).
/// What is printed is what is stored: private values are already `<private>`.
///
/// ```
/// 09:21:10.123 ERROR    [business] checkout failed amount=12.5 card=<private> event=paymentFailed
/// ```
public struct ConsoleEcho: Sendable {
    public enum Colors: Sendable {
        /// When stderr is a terminal.
        case auto
        case always
        case never
    }

    /// Records below this level are not printed (they are still stored).
    public var minimumLevel: LogLevel
    public var colors: Colors
    private let write: @Sendable (String) -> Void

    public init(minimumLevel: LogLevel = .trace, colors: Colors = .auto) {
        self.init(minimumLevel: minimumLevel, colors: colors, to: { line in
            // One write(2) per line: lines from several threads never interleave.
            let bytes = Array(line.utf8)
            var done = 0
            while done < bytes.count {
                let n = bytes[done...].withUnsafeBytes { Foundation.write(2, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return }  // stderr closed: nothing else to do with the line
                done += n
            }
        })
    }

    /// Prints to `write` instead of stderr (one call per line, newline included).
    public init(minimumLevel: LogLevel = .trace, colors: Colors = .never, to write: @escaping @Sendable (String) -> Void) {
        self.minimumLevel = minimumLevel
        self.colors = colors
        self.write = write
    }

    func print(_ entry: LogEntry) {
        guard entry.level >= minimumLevel else { return }
        write(line(entry))
    }

    /// The line printed for `entry`.
    public func line(_ entry: LogEntry) -> String {
        let time = entry.timestamp.rfc3339.split(separator: "T").last.map { String($0.prefix(12)) } ?? ""
        let level = entry.level.description.uppercased().padding(toLength: 8, withPad: " ", startingAt: 0)
        var text = "\(time) \(level) [\(entry.type)] \(entry.message)"
        if !entry.uid.isEmpty { text += " uid=\(entry.uid)" }
        for key in entry.metadata.keys.sorted() { text += " \(key)=\(entry.metadata[key]?.description ?? "")" }
        let coloured: Bool =
            switch colors {
            case .always: true
            case .never: false
            case .auto: isatty(2) == 1
            }
        guard coloured, let code = Self.colour[entry.level] else { return text + "\n" }
        return "\u{1B}[\(code)m" + text + "\u{1B}[0m\n"
    }

    private static let colour: [LogLevel: String] = [
        .trace: "2", .debug: "2", .notice: "36", .warning: "33", .error: "31", .critical: "1;31",
    ]
}
