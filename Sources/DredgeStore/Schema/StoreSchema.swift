import GRDB

/// The store's schema. Migrations are append-only: once a migration has shipped it never
/// changes; a new schema version is a new migration.
enum StoreSchema {
    static let insertLogSQL =
        "INSERT INTO log (ts, level, type, uid, message, metadata, context_id) VALUES (?, ?, ?, ?, ?, ?, ?)"

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE meta (
                        key TEXT PRIMARY KEY NOT NULL,
                        value BLOB NOT NULL
                    ) WITHOUT ROWID;

                    CREATE TABLE context (
                        id INTEGER PRIMARY KEY,
                        fields TEXT NOT NULL UNIQUE,
                        created_at INTEGER NOT NULL
                    );

                    CREATE TABLE log (
                        id INTEGER PRIMARY KEY,
                        ts INTEGER NOT NULL,
                        level INTEGER NOT NULL,
                        type TEXT NOT NULL,
                        uid TEXT NOT NULL,
                        message TEXT NOT NULL,
                        metadata TEXT,
                        context_id INTEGER NOT NULL
                    );
                    CREATE INDEX log_by_ts ON log(ts);
                    CREATE INDEX log_by_uid_ts ON log(uid, ts);

                    CREATE TABLE loss (
                        id INTEGER PRIMARY KEY,
                        recorded_at INTEGER NOT NULL,
                        reason TEXT NOT NULL,
                        count INTEGER NOT NULL,
                        first_ts INTEGER NOT NULL,
                        last_ts INTEGER NOT NULL
                    );
                    CREATE INDEX loss_by_last_ts ON loss(last_ts);
                    """)
        }
        // The runs of the app processes (#54, ``StoreRun``): started, ended cleanly or not, and
        // the rewind buffer each keeps beside the store.
        migrator.registerMigration("v2-runs") { db in
            try db.execute(
                sql: """
                    CREATE TABLE run (
                        id TEXT PRIMARY KEY NOT NULL,
                        context_id INTEGER NOT NULL,
                        pid INTEGER NOT NULL,
                        pid_namespace TEXT NOT NULL,
                        boot TEXT NOT NULL,
                        process_start INTEGER NOT NULL,
                        started_at INTEGER NOT NULL,
                        ended_at INTEGER,
                        ending TEXT,
                        rewind TEXT,
                        rewound INTEGER NOT NULL DEFAULT 0
                    );
                    CREATE INDEX run_open ON run(ending) WHERE ending IS NULL;
                    CREATE INDEX run_by_started_at ON run(started_at);
                    """)
        }
        return migrator
    }
}
