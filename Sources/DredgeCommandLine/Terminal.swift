import Foundation

/// Text from devices (messages, metadata, contexts, feedback, an agent's refusal details) made
/// harmless for a terminal. An agent chooses those bytes: raw, ESC and the C1 controls would let
/// it move the cursor, rewrite what the engineer reads, set the window title or write the
/// clipboard (OSC 52); CR and backspaces would overwrite a line; bidirectional overrides would
/// reorder it. Every human-readable output of the tools goes through here; JSON output stays
/// exact.
public enum Terminal {
    /// `text` with every control character written as `\u{…}`: C0 (U+0000–U+001F) but line
    /// feed and tab unless `keepingLines` is false, DEL, C1 (U+0080–U+009F), and the
    /// bidirectional marks and overrides (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069).
    /// Text with none comes back as it is.
    public static func visible(_ text: String, keepingLines: Bool = true) -> String {
        guard text.unicodeScalars.contains(where: { needsEscape($0, keepingLines: keepingLines) }) else { return text }
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            if needsEscape(scalar, keepingLines: keepingLines) {
                out.append(contentsOf: "\\u{\(String(scalar.value, radix: 16, uppercase: true))}".unicodeScalars)
            } else {
                out.append(scalar)
            }
        }
        return String(out)
    }

    /// One line of agent-supplied text: line breaks escaped too, so it cannot forge lines.
    public static func field(_ text: String) -> String { visible(text, keepingLines: false) }

    static func needsEscape(_ scalar: Unicode.Scalar, keepingLines: Bool) -> Bool {
        switch scalar.value {
        case 0x0A, 0x09: return !keepingLines
        case 0x00...0x1F, 0x7F...0x9F: return true
        case 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }

    /// Writes `text` (made ``visible(_:keepingLines:)``) to standard error.
    public static func error(_ text: String) {
        FileHandle.standardError.write(Data(visible(text).utf8))
    }
}
