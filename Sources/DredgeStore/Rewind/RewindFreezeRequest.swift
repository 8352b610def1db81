import DredgeDomain
import Foundation
import GRDB

/// Asking the apps that keep a rewind buffer over a store to freeze it (#54, Protocol § 21,
/// *Rewind*): the agent, at a trigger's match, counts one more request in the store's meta;
/// each ``LogCenter`` that keeps a buffer looks at the count about once a second and freezes
/// its buffer when it went up, so the capture holds the debug records from before the match.
extension LogStore {
    static let freezeRequestKey = "rewind-freeze"

    /// How many freezes were asked for so far (0: none). A value that does not read is 0.
    public func rewindFreezeRequests() throws -> Int64 {
        do {
            return try pool.read { db in try Self.freezeRequests(db) }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Asks every app with a rewind buffer over this store to freeze it; returns the new count.
    @discardableResult
    public func requestRewindFreeze() throws -> Int64 {
        do {
            return try pool.write { db in
                let next = try Self.freezeRequests(db) &+ 1
                try db.execute(
                    sql: "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    arguments: [Self.freezeRequestKey, Data(String(next).utf8)])
                return next
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    private static func freezeRequests(_ db: Database) throws -> Int64 {
        guard let data = try Data.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: [freezeRequestKey]) else { return 0 }
        return Int64(String(decoding: data, as: UTF8.self)) ?? 0
    }
}
