import GRDB

/// Opens one of the server's SQLite files: WAL with `synchronous=NORMAL`, so the listener's
/// frequent small writes (heartbeats, chunk progress) are cheap and the operator's commands
/// (`dredge-server agents`, `pulls`) read without blocking it.
enum ServerDatabase {
    static func open(_ path: String, migrations: (inout DatabaseMigrator) -> Void) throws -> DatabasePool {
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        let pool = try DatabasePool(path: path, configuration: configuration)
        var migrator = DatabaseMigrator()
        migrations(&migrator)
        try migrator.migrate(pool)
        return pool
    }
}
