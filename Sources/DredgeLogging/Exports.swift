// One import for an app: `import DredgeLogging` also brings the types a log call and a store
// configuration need (levels, types, timestamps, contexts, filters from DredgeDomain; the
// store, its configuration, retention and values from DredgeStore).
@_exported import DredgeDomain
@_exported import DredgeStore
// swift-log, for `LoggingSystem.bootstrap { center.logHandler(label: $0) }` and `Logger`.
@_exported import Logging
