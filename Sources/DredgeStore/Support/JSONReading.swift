import Foundation

/// Decoding helpers for the few places that read JSON back (metadata, context rows).
enum JSONReading {
    static func decode<T: Decodable>(_ type: T.Type, from text: String) throws -> T {
        try JSONDecoder().decode(type, from: Data(text.utf8))
    }
}
