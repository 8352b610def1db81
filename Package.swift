// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "Dredge",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "DredgeDomain", targets: ["DredgeDomain"]),
        .library(name: "DredgeJSON", targets: ["DredgeJSON"]),
        .library(name: "DredgeStore", targets: ["DredgeStore"]),
        .library(name: "DredgeLogging", targets: ["DredgeLogging"]),
        .library(name: "DredgeWire", targets: ["DredgeWire"]),
        .library(name: "DredgeEnvelope", targets: ["DredgeEnvelope"]),
        .library(name: "DredgePayload", targets: ["DredgePayload"]),
        .library(name: "DredgeReception", targets: ["DredgeReception"]),
        .library(name: "DredgeExport", targets: ["DredgeExport"]),
        .library(name: "DredgeServer", targets: ["DredgeServer"]),
        .library(name: "DredgeAdminAPI", targets: ["DredgeAdminAPI"]),
        .library(name: "DredgeAdminClient", targets: ["DredgeAdminClient"]),
        .library(name: "DredgeAgentCore", targets: ["DredgeAgentCore"]),
        .executable(name: "dredge", targets: ["dredge"]),
        .executable(name: "dredge-server", targets: ["dredge-server"]),
        .executable(name: "dredge-agent", targets: ["dredge-agent"]),
        .executable(name: "dredge-demo", targets: ["dredge-demo"]),
        .executable(name: "dredge-bench", targets: ["dredge-bench"]),
    ],
    traits: [
        // The server, the agent, the command-line tools and the dependencies only they need
        // (SwiftNIO, NIOSSL, Hummingbird, swift-certificates, swift-protobuf, ZIPFoundation,
        // ArgumentParser, ServiceLifecycle). On by default; an app that only logs depends on
        // this package with `traits: []` and fetches and builds none of them: the logging
        // library needs GRDB, swift-log and swift-crypto only.
        .trait(name: "Server"),
        .default(enabledTraits: ["Server"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
        .package(url: "https://github.com/weichsel/ZIPFoundation", from: "0.9.20"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        // HTTP parts as Hummingbird's pipeline carries them: the admin listener's deadlines watch them.
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        // No default traits: the admin API needs neither swift-configuration nor full Foundation.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: []),
        .package(url: "https://github.com/hummingbird-project/swift-mustache", from: "2.1.1"),
        // The admin client: HTTPS with a pinned CA, streamed downloads.
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        // The PostgreSQL back end (several server nodes on one database).
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        // The server's metrics, exposed for Prometheus (`GET /metrics`).
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // The console's single sign-on: ID tokens verified against the identity provider's keys.
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.8.0"),
    ],
    targets: [
        // What every other module agrees on, with no dependencies: timestamps, levels, types,
        // filters (and their versioned stored form), uids and the limits shared by all ends.
        .target(name: "DredgeDomain"),
        // The one JSON reader of the server (a scanner over bytes with hooks): the indexer's
        // record lines, the search page's metadata check, the metadata parser and the schema
        // checker's first pass. No dependencies, no allocation of its own.
        .target(name: "DredgeJSON"),
        // The client's local, bounded log store: schema, migrations, batched writer, retention,
        // queries by filter. No networking.
        .target(
            name: "DredgeStore",
            dependencies: [
                "DredgeDomain",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]
        ),
        // The logging API apps embed: levels, types, privacy per value, the swift-log handler.
        .target(
            name: "DredgeLogging",
            dependencies: [
                "DredgeDomain", "DredgeStore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The wire protocol's pure core: generated messages, framing, limits, canonical signing
        // inputs and the connection and upload state machines. No sockets, no database.
        .target(
            name: "DredgeWire",
            dependencies: [
                "DredgeDomain", "DredgeJSON",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "SwiftProtobuf", package: "swift-protobuf", condition: .when(traits: ["Server"])),
            ]
        ),
        // The encryption envelope: key wrap, command and challenge signatures, chunk sealing.
        .target(
            name: "DredgeEnvelope",
            dependencies: [
                "DredgeWire",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ]
        ),
        .systemLibrary(name: "CDredgeZlib", providers: [.apt(["zlib1g-dev"])]),
        // ISA-L's inflate (igzip), for the server's unpacking of uploads as they arrive.
        .systemLibrary(name: "CDredgeISAL", providers: [.apt(["libisal-dev"])]),
        // The one system call Swift's Glibc module does not declare: starting writeback early
        // (sync_file_range), so a long durable write's last fsync waits for little.
        .target(name: "CDredgeSystem"),
        // The payload both ends share, without the client store: the manifest and its limits,
        // sealing an upload into chunks, sealed export files, and durable file writes.
        .target(
            name: "DredgePayload",
            dependencies: [
                "DredgeDomain", "DredgeWire", "DredgeEnvelope", "CDredgeSystem",
                .product(name: "SwiftProtobuf", package: "swift-protobuf", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // Receiving a payload, which only the server (and `dredge`, opening sealed exports) does:
        // extraction with limits (of a finished zip with ZIPFoundation, or front to back while
        // it arrives, inflated with ISA-L), the manifest's schema, reassembling an upload. An
        // agent links none of it.
        .target(
            name: "DredgeReception",
            dependencies: [
                "DredgeDomain", "DredgeJSON", "DredgeWire", "DredgeEnvelope", "DredgePayload", "CDredgeZlib", "CDredgeSystem",
                .target(name: "CDredgeISAL", condition: .when(traits: ["Server"])),
                .product(name: "ZIPFoundation", package: "ZIPFoundation", condition: .when(traits: ["Server"])),
                .product(name: "SwiftProtobuf", package: "swift-protobuf", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The agent's export: store → per-day files → zip (deflated in parallel) → a payload.
        .target(
            name: "DredgeExport",
            dependencies: [
                "DredgeDomain", "DredgeStore", "DredgePayload", "DredgeWire", "DredgeEnvelope", "CDredgeZlib",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The admin API's messages (no networking): what the server answers and `dredge` reads.
        .target(
            name: "DredgeAdminAPI",
            dependencies: [
                "DredgeDomain", "DredgeJSON",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The admin API's HTTPS client with a pinned CA and resumable, checked downloads (what
        // `dredge` speaks); the server does not link it.
        .target(
            name: "DredgeAdminClient",
            dependencies: [
                "DredgeDomain", "DredgeAdminAPI",
                .product(name: "AsyncHTTPClient", package: "async-http-client", condition: .when(traits: ["Server"])),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["Server"])),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOHTTP1", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The command server: deployment material (CA, certificates, keys, tokens), the agent
        // listener, registry, command queue, upload reception and the admin HTTP API.
        .target(
            name: "DredgeServer",
            dependencies: [
                "DredgeDomain", "DredgeJSON", "DredgeWire", "DredgeEnvelope", "DredgePayload", "DredgeReception", "DredgeAdminAPI", "CDredgeSystem",
                .product(name: "SwiftProtobuf", package: "swift-protobuf", condition: .when(traits: ["Server"])),
                .product(name: "ZIPFoundation", package: "ZIPFoundation", condition: .when(traits: ["Server"])),
                .product(name: "Hummingbird", package: "hummingbird", condition: .when(traits: ["Server"])),
                .product(name: "HummingbirdTLS", package: "hummingbird", condition: .when(traits: ["Server"])),
                .product(name: "HummingbirdCore", package: "hummingbird", condition: .when(traits: ["Server"])),
                .product(name: "Mustache", package: "swift-mustache", condition: .when(traits: ["Server"])),
                .product(name: "X509", package: "swift-certificates", condition: .when(traits: ["Server"])),
                .product(name: "SwiftASN1", package: "swift-asn1", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["Server"])),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras", condition: .when(traits: ["Server"])),
                .product(name: "NIOTLS", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle", condition: .when(traits: ["Server"])),
                .product(name: "PostgresNIO", package: "postgres-nio", condition: .when(traits: ["Server"])),
                .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["Server"])),
                .product(name: "Metrics", package: "swift-metrics", condition: .when(traits: ["Server"])),
                .product(name: "JWTKit", package: "jwt-kit", condition: .when(traits: ["Server"])),
                .product(name: "AsyncHTTPClient", package: "async-http-client", condition: .when(traits: ["Server"])),
            ]
        ),
        // What the command-line tools share: the record filter flags.
        .target(
            name: "DredgeCommandLine",
            dependencies: ["DredgeDomain", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Server"]))]
        ),
        // The support engineers' command line, a client of the admin API.
        .executableTarget(
            name: "dredge",
            dependencies: ["DredgeAdminAPI", "DredgeAdminClient", "DredgeDomain", "DredgeCommandLine", "DredgePayload", "DredgeReception", "DredgeEnvelope", "DredgeWire", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Server"]))]
        ),
        .executableTarget(
            name: "dredge-server",
            dependencies: [
                "DredgeServer", "DredgeDomain", "DredgeAdminAPI", "DredgeCommandLine",
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Server"])), .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics", condition: .when(traits: ["Server"])),
                .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["Server"])),
            ]
        ),
        // Realistic synthetic logs for the demo, the benchmarks and the tests.
        .target(name: "DredgeSamples", dependencies: ["DredgeDomain", "DredgeStore"]),
        // The agent as a library: enrollment, the connection loop, and (next) pulls and uploads.
        .target(
            name: "DredgeAgentCore",
            dependencies: [
                "DredgeDomain", "DredgeStore", "DredgeWire", "DredgeEnvelope", "DredgePayload", "DredgeExport",
                .product(name: "SwiftProtobuf", package: "swift-protobuf", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["Server"])),
                .product(name: "NIOTLS", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle", condition: .when(traits: ["Server"])),
            ]
        ),
        .executableTarget(
            name: "dredge-agent",
            dependencies: [
                "DredgeDomain", "DredgeStore", "DredgeLogging", "DredgeAgentCore", "DredgeWire", "DredgeCommandLine", "DredgePayload", "DredgeExport", "DredgeEnvelope",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle", condition: .when(traits: ["Server"])),
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Server"])),
            ]
        ),
        .executableTarget(
            name: "dredge-demo",
            dependencies: [
                "DredgeDomain", "DredgeStore", "DredgeLogging", "DredgeSamples", "DredgePayload",
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Server"])),
            ]
        ),
        .executableTarget(
            name: "dredge-bench",
            dependencies: [
                "DredgeDomain", "DredgeStore", "DredgeLogging", "DredgeSamples", "DredgeWire", "DredgeEnvelope", "DredgePayload", "DredgeReception", "DredgeExport", "CDredgeZlib", "CDredgeSystem",
                "DredgeServer", "DredgeAgentCore", "DredgeAdminAPI", "DredgeAdminClient",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOTLS", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["Server"])),
                .product(name: "Hummingbird", package: "hummingbird", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Server"])),
            ]
        ),
        // A child process for crash tests: logs, flushes, reports, then waits to be killed.
        .executableTarget(
            name: "store-crash-child",
            dependencies: ["DredgeDomain", "DredgeStore", "DredgeLogging"],
            path: "Tests/Helpers/store-crash-child"
        ),
        // The frame decoder's fuzz target; a corpus replayer when not built for libFuzzer.
        .executableTarget(
            name: "dredge-fuzz-frames",
            dependencies: ["DredgeWire", .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"]))],
            path: "Tests/Fuzz/FrameFuzzer"
        ),
        // Helpers the test targets share: temporary directories, finding built executables.
        .target(name: "DredgeTestSupport", path: "Tests/DredgeTestSupport"),
        .testTarget(
            name: "DredgeStoreTests",
            dependencies: ["DredgeDomain", "DredgeStore", "DredgeSamples", "DredgeTestSupport", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .testTarget(name: "DredgeDomainTests", dependencies: ["DredgeDomain"]),
        .testTarget(name: "DredgeJSONTests", dependencies: ["DredgeJSON"]),
        .testTarget(
            name: "DredgeAgentTests",
            dependencies: [
                "DredgeTestSupport", "DredgeDomain", "DredgeEnvelope", "DredgeWire", "DredgeAgentCore", "DredgeStore", "DredgeSamples", "DredgePayload", "DredgeExport", "DredgeCommandLine",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .testTarget(
            name: "DredgeServerTests",
            dependencies: [
                "DredgeServer", "DredgeDomain", "DredgePayload", "DredgeReception", "DredgeEnvelope", "DredgeStore", "DredgeSamples", "DredgeTestSupport", "DredgeAdminAPI", "DredgeAdminClient", "DredgeAgentCore", "DredgeWire", "DredgeExport",
                "DredgeLogging", "DredgeCommandLine",
                .product(name: "X509", package: "swift-certificates", condition: .when(traits: ["Server"])),
                .product(name: "NIOSSL", package: "swift-nio-ssl", condition: .when(traits: ["Server"])),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])), .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOEmbedded", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOHTTP1", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOTLS", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ZIPFoundation", package: "ZIPFoundation", condition: .when(traits: ["Server"])),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle", condition: .when(traits: ["Server"])),
                .product(name: "Hummingbird", package: "hummingbird", condition: .when(traits: ["Server"])),
                .product(name: "HummingbirdTesting", package: "hummingbird", condition: .when(traits: ["Server"])),
                .product(name: "AsyncHTTPClient", package: "async-http-client", condition: .when(traits: ["Server"])),
            ]
        ),
        .testTarget(
            name: "DredgeWireTests",
            dependencies: [
                "DredgeWire", "DredgeEnvelope", "DredgeDomain", "DredgeTestSupport",
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOEmbedded", package: "swift-nio", condition: .when(traits: ["Server"])),
                .product(name: "NIOTestUtils", package: "swift-nio", condition: .when(traits: ["Server"])),
            ]
        ),
        .testTarget(
            name: "DredgeEnvelopeTests",
            dependencies: ["DredgeEnvelope", "DredgeWire", "DredgeTestSupport", .product(name: "Crypto", package: "swift-crypto"), .product(name: "_CryptoExtras", package: "swift-crypto")]
        ),
        .testTarget(
            name: "DredgeExportTests",
            dependencies: [
                "DredgeDomain", "DredgePayload", "DredgeReception", "DredgeExport", "DredgeEnvelope", "DredgeWire", "DredgeStore", "DredgeSamples", "DredgeTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ZIPFoundation", package: "ZIPFoundation", condition: .when(traits: ["Server"])),
            ]
        ),
        .testTarget(
            name: "DredgeLoggingTests",
            dependencies: [
                "DredgeDomain", "DredgeLogging", "DredgeStore", "DredgeTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Hummingbird", package: "hummingbird", condition: .when(traits: ["Server"])),
            ]
        ),
    ]
)
