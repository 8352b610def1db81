import Logging
import PostgresNIO

/// The PostgreSQL back end's tables and their migrations, applied in order by every node that
/// opens the database; each migration once, in one transaction, recorded in `dredge_migration`.
/// A migration added later goes at the end; one that has run is never edited.
///
/// The tables mirror the embedded back end's (``ServerDatabase``, ``SQLiteRecordIndex``), with
/// PostgreSQL's types: `bytea` keys, `boolean` flags, identity ids, and in the index a
/// `tsvector` column over each record's message and metadata (their first 50,000 characters
/// each: a `tsvector` holds at most 1 MB) with a GIN index (text search
/// configuration `dredge_text`: the `simple` parser and dictionary behind `unaccent`, so case
/// and accents are ignored and no word is dropped or stemmed).
enum PostgresSchema {
    static let queryLogger = Logger(label: "dredge.postgres.query")

    /// Every migration: its id and its statements.
    static let migrations: [(id: String, statements: [String])] = [
        (
            "server-v1",
            [
                """
                CREATE TABLE agent (
                    id text COLLATE "C" PRIMARY KEY,
                    public_key bytea NOT NULL,
                    hostname text COLLATE "C" NOT NULL,
                    os text NOT NULL,
                    app text NOT NULL,
                    app_version text NOT NULL,
                    enrolled_at double precision NOT NULL,
                    connected boolean NOT NULL DEFAULT false,
                    connected_at double precision,
                    remote_address text,
                    last_heartbeat_at double precision,
                    active_uids text NOT NULL DEFAULT '[]',
                    store_records bigint NOT NULL DEFAULT 0,
                    generation bigint NOT NULL DEFAULT 0,
                    labels text NOT NULL DEFAULT '{}',
                    users_reported bigint NOT NULL DEFAULT 0,
                    users_truncated boolean NOT NULL DEFAULT false,
                    users_digest text NOT NULL DEFAULT ''
                )
                """,
                """
                CREATE TABLE agent_uid (
                    uid text COLLATE "C" NOT NULL,
                    agent_id text COLLATE "C" NOT NULL REFERENCES agent(id),
                    PRIMARY KEY (uid, agent_id)
                )
                """,
                "CREATE INDEX agent_uid_by_agent ON agent_uid(agent_id)",
                """
                CREATE TABLE agent_user (
                    uid text COLLATE "C" NOT NULL,
                    agent_id text COLLATE "C" NOT NULL REFERENCES agent(id),
                    last_seen_us bigint NOT NULL,
                    PRIMARY KEY (uid, agent_id)
                )
                """,
                "CREATE INDEX agent_user_by_agent ON agent_user(agent_id)",
                """
                CREATE TABLE pull (
                    id text COLLATE "C" PRIMARY KEY,
                    seq bigint GENERATED ALWAYS AS IDENTITY,
                    uid text COLLATE "C" NOT NULL,
                    agent_id text COLLATE "C" NOT NULL,
                    filter text NOT NULL,
                    issued_at bigint NOT NULL,
                    expires_at bigint NOT NULL,
                    wrapped_key bytea NOT NULL,
                    requested_by text NOT NULL,
                    created_at double precision NOT NULL,
                    removed_at double precision,
                    removed_by text,
                    removed_reason text
                )
                """,
                """
                CREATE TABLE pull_target (
                    pull_id text COLLATE "C" NOT NULL REFERENCES pull(id),
                    agent_id text COLLATE "C" NOT NULL,
                    status text NOT NULL,
                    detail text NOT NULL DEFAULT '',
                    chunks_received bigint NOT NULL DEFAULT 0,
                    chunk_count bigint NOT NULL DEFAULT 0,
                    bytes bigint NOT NULL DEFAULT 0,
                    files text NOT NULL DEFAULT '[]',
                    updated_at double precision NOT NULL,
                    error_code bigint,
                    PRIMARY KEY (pull_id, agent_id)
                )
                """,
                "CREATE INDEX pull_target_by_agent ON pull_target(agent_id, status)",
                "CREATE INDEX pull_target_by_status ON pull_target(status, agent_id)",
                "CREATE INDEX pull_open_by_uid ON pull(expires_at, uid) WHERE agent_id = ''",
                "CREATE INDEX pull_kept ON pull(expires_at) WHERE removed_at IS NULL",
                "CREATE INDEX pull_by_creation ON pull(created_at, seq)",
                """
                CREATE TABLE audit (
                    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    at double precision NOT NULL,
                    actor text COLLATE "C" NOT NULL,
                    action text COLLATE "C" NOT NULL,
                    detail text NOT NULL
                )
                """,
                """
                CREATE TABLE feedback (
                    id text COLLATE "C" PRIMARY KEY,
                    seq bigint GENERATED ALWAYS AS IDENTITY,
                    agent_id text COLLATE "C" NOT NULL,
                    uid text NOT NULL,
                    text text NOT NULL,
                    created_at_us bigint NOT NULL,
                    received_at double precision NOT NULL,
                    status text NOT NULL,
                    detail text NOT NULL DEFAULT '',
                    chunks_received bigint NOT NULL DEFAULT 0,
                    chunk_count bigint NOT NULL DEFAULT 0,
                    bytes bigint NOT NULL DEFAULT 0,
                    records bigint NOT NULL DEFAULT 0,
                    files text NOT NULL DEFAULT '[]',
                    error_code bigint,
                    removed_at double precision,
                    removed_by text,
                    removed_reason text
                )
                """,
                "CREATE INDEX feedback_by_time ON feedback(received_at, seq)",
                "CREATE INDEX feedback_by_agent ON feedback(agent_id, received_at)",
                "CREATE INDEX feedback_kept ON feedback(received_at) WHERE removed_at IS NULL",
                """
                CREATE TABLE token (
                    kind text COLLATE "C" NOT NULL,
                    name text COLLATE "C" NOT NULL,
                    sha256 text NOT NULL UNIQUE,
                    created_at double precision NOT NULL,
                    PRIMARY KEY (kind, name)
                )
                """,
            ]
        ),
        (
            "index-v1",
            [
                // Where unaccent is (an extension lives in one schema of the database), for the
                // text search configuration's mapping.
                """
                DO $$
                DECLARE home text;
                BEGIN
                    SELECT n.nspname INTO home FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'unaccent';
                    EXECUTE 'CREATE TEXT SEARCH CONFIGURATION dredge_text (COPY = pg_catalog.simple)';
                    EXECUTE format('ALTER TEXT SEARCH CONFIGURATION dredge_text ALTER MAPPING FOR asciiword, word, numword, asciihword, hword, numhword, '
                        'hword_asciipart, hword_part, hword_numpart WITH %I.unaccent, simple', home);
                END
                $$
                """,
                // A record's metadata as JSON, or NULL when PostgreSQL cannot read it (jsonb
                // refuses \\u0000, which JSON allows): metadata matches compare through it.
                """
                CREATE FUNCTION dredge_json(t text) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
                BEGIN
                    RETURN t::jsonb;
                EXCEPTION WHEN others THEN
                    RETURN NULL;
                END
                $$
                """,
                """
                CREATE TABLE source (
                    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    kind text COLLATE "C" NOT NULL,
                    ref text COLLATE "C" NOT NULL,
                    agent text COLLATE "C" NOT NULL,
                    indexed boolean NOT NULL DEFAULT false,
                    records bigint NOT NULL DEFAULT 0,
                    unreadable bigint NOT NULL DEFAULT 0,
                    landed_at double precision NOT NULL,
                    UNIQUE (kind, ref, agent)
                )
                """,
                """
                CREATE TABLE context (
                    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    source bigint NOT NULL,
                    key bigint NOT NULL,
                    host text COLLATE "C" NOT NULL,
                    os text NOT NULL,
                    app text COLLATE "C" NOT NULL,
                    app_version text NOT NULL,
                    process text NOT NULL,
                    UNIQUE (source, key)
                )
                """,
                "CREATE INDEX context_host ON context(host)",
                "CREATE INDEX context_app ON context(app)",
                """
                CREATE TABLE record (
                    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    source bigint NOT NULL,
                    context bigint,
                    ts bigint NOT NULL,
                    uid text COLLATE "C" NOT NULL,
                    level integer NOT NULL,
                    type text COLLATE "C" NOT NULL,
                    message text NOT NULL,
                    metadata text NOT NULL,
                    words tsvector GENERATED ALWAYS AS (to_tsvector('dredge_text', left(message, 50000)) || to_tsvector('dredge_text', left(metadata, 50000))) STORED
                )
                """,
                "CREATE INDEX record_ts ON record(ts, id)",
                "CREATE INDEX record_uid_ts ON record(uid, ts, id)",
                "CREATE INDEX record_source_ts ON record(source, ts, id)",
                "CREATE INDEX record_words ON record USING gin (words)",
                "CREATE INDEX record_meta ON record USING gin (dredge_json(metadata) jsonb_path_ops)",
            ]
        ),
        (
            "cluster-v1",
            [
                // The nodes of a cluster and their leases (NodeLease); times by the database's clock.
                """
                CREATE TABLE node (
                    id text COLLATE "C" PRIMARY KEY,
                    name text NOT NULL,
                    started_at double precision NOT NULL,
                    renewed_at double precision NOT NULL,
                    lease_seconds double precision NOT NULL
                )
                """,
                // The node that holds an agent's connection: its presence lasts as long as that node's lease.
                "ALTER TABLE agent ADD COLUMN node_id text COLLATE \"C\"",
                // The node indexing a source: another node takes it over only once that node's lease ran out.
                "ALTER TABLE source ADD COLUMN claimed_by text COLLATE \"C\"",
            ]
        ),
        (
            "index-registered-device-v1",
            [
                // The device a source came from, as the registry knew its agent (NULL: indexed
                // before, named by its contexts alone).
                "ALTER TABLE source ADD COLUMN host text COLLATE \"C\", ADD COLUMN app text COLLATE \"C\", ADD COLUMN app_version text, ADD COLUMN os text",
                "CREATE INDEX source_host ON source(host)",
            ]
        ),
        (
            "pull-reason-v1",
            [
                // A pull's reason (a ticket) is part of the pull, shown and searched.
                "ALTER TABLE pull ADD COLUMN reason text NOT NULL DEFAULT ''"
            ]
        ),
        (
            "index-types-v1",
            [
                // The log types records have had, for telling a filter's typo (RecordVocabulary).
                "CREATE TABLE record_type (type text COLLATE \"C\" PRIMARY KEY)",
                "INSERT INTO record_type (type) SELECT DISTINCT type FROM record",
            ]
        ),
        (
            "console-sessions-v1",
            [
                // Console sessions outlive a restart and reach every node (#50): hashes only.
                """
                CREATE TABLE console_session (
                    key text COLLATE "C" PRIMARY KEY,
                    token_name text COLLATE "C" NOT NULL,
                    token_sha256 text NOT NULL,
                    expires_at double precision NOT NULL
                )
                """,
                "CREATE INDEX console_session_by_expiry ON console_session(expires_at)",
                "CREATE INDEX console_session_by_token ON console_session(token_sha256)",
            ]
        ),
        (
            "agent-revocation-v1",
            [
                // A revoked agent (a lost device, a decommissioned host, #56): refused from then on, what it uploaded kept.
                "ALTER TABLE agent ADD COLUMN revoked_at double precision",
                "ALTER TABLE agent ADD COLUMN revoked_by text",
            ]
        ),
        (
            "token-limits-v1",
            [
                // Enrollment tokens that expire, or have a number of uses (#56).
                "ALTER TABLE token ADD COLUMN expires_at double precision",
                "ALTER TABLE token ADD COLUMN uses_left integer",
            ]
        ),
        (
            "agent-key-generation-v1",
            [
                // The generation of the server's keys each agent pins (key rotation, #56).
                "ALTER TABLE agent ADD COLUMN key_generation integer NOT NULL DEFAULT 1",
            ]
        ),
        (
            "audit-chain-v1",
            [
                // The audit log as a hash chain (#55); the entries before it are chained in
                // the same step (PostgresPullQueue.chainExisting, run by migrate).
                "ALTER TABLE audit ADD COLUMN hash bytea",
            ]
        ),
        (
            "token-roles-v1",
            [
                // Admin tokens with a role and a scope (#55); the ones before were admins.
                "ALTER TABLE token ADD COLUMN role text NOT NULL DEFAULT 'admin'",
                "ALTER TABLE token ADD COLUMN scope text",
            ]
        ),
        (
            "pull-scope-v1",
            [
                // A scoped caller's pull (#55): its scope, and no agent joins it later.
                "ALTER TABLE pull ADD COLUMN scope text",
            ]
        ),
        (
            "console-session-sso-v1",
            [
                // Sessions of people signed in through the identity provider (#55): no token;
                // their role and scope kept with the session.
                "ALTER TABLE console_session ADD COLUMN role text",
                "ALTER TABLE console_session ADD COLUMN scope text",
            ]
        ),
        (
            "pull-approval-v1",
            [
                // Pulls that wait for a second person's approval (#55).
                "ALTER TABLE pull ADD COLUMN approval_required boolean NOT NULL DEFAULT false",
                "ALTER TABLE pull ADD COLUMN approved_by text",
                "ALTER TABLE pull ADD COLUMN approved_at double precision",
            ]
        ),
        // Live tails (#53).
        PostgresTailRegistry.migration,
        // Standing triggers (#54).
        PostgresTriggerRegistry.migration,
        PostgresTriggerRegistry.migrationV2,
        (
            "urgent-v1",
            [
                // Pulls and tails an engineer marks urgent (#54, Protocol § 22).
                "ALTER TABLE pull ADD COLUMN urgent boolean NOT NULL DEFAULT false",
                "ALTER TABLE tail ADD COLUMN urgent boolean NOT NULL DEFAULT false",
            ]
        ),
    ]

    /// Applies the migrations not applied yet, in one transaction under an advisory lock: nodes
    /// starting together take turns, and a migration cut short leaves nothing behind.
    /// The ids of the migrations the schema has had.
    private static func applied(_ schema: String, on c: PostgresConnection) async throws -> Set<String> {
        Set(try await c.rows(PostgresQuery(unsafeSQL: "SELECT id FROM \(schema).dredge_migration")).map { try $0.decode(String.self) })
    }

    static func migrate(_ database: PostgresDatabase) async throws {
        let schema = database.location.schema
        // Already migrated (every node's start, every `dredge-server` command after `init`):
        // nothing to do, and no lock taken, so opens never wait on one another.
        let current = try await database.read { c -> Bool in
            guard try await c.value("SELECT count(*) FROM pg_extension WHERE extname = 'unaccent'", as: Int64.self) == 1,
                try await c.value("SELECT to_regclass(\(schema + ".dredge_migration")) IS NOT NULL", as: Bool.self) == true
            else { return false }
            let applied = try await Self.applied(schema, on: c)
            return migrations.allSatisfy { applied.contains($0.id) }
        }
        if current { return }
        try await database.write { c in
            try await c.run("SELECT pg_advisory_xact_lock(7466218401)")
            // The extension is the database's (one per database): made once, by its owner or a
            // superuser (an operator without the right makes it beforehand: see the deployment guide).
            try await c.run(PostgresQuery(unsafeSQL: "CREATE SCHEMA IF NOT EXISTS \(schema)"))
            try await c.run("CREATE EXTENSION IF NOT EXISTS unaccent SCHEMA public")
            try await c.run(
                PostgresQuery(unsafeSQL: "CREATE TABLE IF NOT EXISTS \(schema).dredge_migration (id text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"))
            let applied = try await Self.applied(schema, on: c)
            for migration in migrations where !applied.contains(migration.id) {
                for statement in migration.statements { try await c.run(PostgresQuery(unsafeSQL: statement)) }
                if migration.id == "audit-chain-v1" { try await PostgresPullQueue.chainExisting(on: c) }
                try await c.run("INSERT INTO dredge_migration (id) VALUES (\(migration.id))")
            }
        }
    }
}
