import DredgePayload
import Foundation

/// `Protocol/manifest.schema.json`, the normative JSON Schema of `manifest.json`, compiled into
/// the library so every reader (the server, `dredge open-export`) checks a manifest against the
/// very rules the specification publishes. `ProtocolVectorTests` fails if this copy and the
/// file in `Protocol/` differ.
public enum ManifestSchema {
    /// The schema document, byte for byte as in `Protocol/manifest.schema.json`.
    public static let text = #"""
{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$id": "https://dredge.invalid/protocol/v1/manifest.schema.json",
  "title": "manifest.json of a Dredge payload (Protocol/README.md section 13)",
  "description": "Normative. A receiver validates manifest.json against this schema, then applies the rules of section 13 that a schema cannot state (the days against the zip's entries, the counts, the header). Fields not named here are ignored by receivers, except inside filter, where an unknown field would change what was selected. Patterns end in (?![\\s\\S]), not $: in several regular expression engines $ also matches before a final line break, which would let \"…\\n\" through.",
  "type": "object",
  "required": [
    "format",
    "upload_id",
    "kind",
    "agent_id",
    "created_at",
    "filter",
    "record_count",
    "empty",
    "days",
    "contexts",
    "losses"
  ],
  "properties": {
    "format": {
      "const": "dredge-export/1"
    },
    "upload_id": {
      "$ref": "#/$defs/id"
    },
    "kind": {
      "enum": [
        "pull",
        "feedback",
        "export",
        "capture"
      ]
    },
    "command_id": {
      "$ref": "#/$defs/id"
    },
    "agent_id": {
      "description": "The uploading agent's id; in a manual export file (kind export) also the empty string, for an agent that is not enrolled.",
      "type": "string",
      "pattern": "^([0-9a-f]{32})?(?![\\s\\S])"
    },
    "created_at": {
      "$ref": "#/$defs/timestamp"
    },
    "filter": {
      "$ref": "#/$defs/filter"
    },
    "record_count": {
      "type": "integer",
      "minimum": 0
    },
    "empty": {
      "type": "boolean"
    },
    "days": {
      "type": "array",
      "items": {
        "$ref": "#/$defs/day"
      }
    },
    "contexts": {
      "type": "object",
      "propertyNames": {
        "pattern": "^(0|[1-9][0-9]{0,18})(?![\\s\\S])"
      },
      "additionalProperties": {
        "$ref": "#/$defs/context"
      }
    },
    "losses": {
      "type": "array",
      "items": {
        "$ref": "#/$defs/loss"
      }
    },
    "feedback": {
      "$ref": "#/$defs/feedback"
    },
    "capture": {
      "$ref": "#/$defs/capture"
    }
  },
  "allOf": [
    {
      "if": {
        "properties": {
          "kind": {
            "const": "pull"
          }
        }
      },
      "then": {
        "required": [
          "command_id"
        ],
        "allOf": [
          {
            "not": {
              "required": [
                "feedback"
              ]
            }
          },
          {
            "not": {
              "required": [
                "capture"
              ]
            }
          }
        ]
      }
    },
    {
      "if": {
        "properties": {
          "kind": {
            "const": "feedback"
          }
        }
      },
      "then": {
        "required": [
          "feedback"
        ],
        "allOf": [
          {
            "not": {
              "required": [
                "command_id"
              ]
            }
          },
          {
            "not": {
              "required": [
                "capture"
              ]
            }
          }
        ]
      }
    },
    {
      "if": {
        "properties": {
          "kind": {
            "const": "export"
          }
        }
      },
      "then": {
        "allOf": [
          {
            "not": {
              "required": [
                "feedback"
              ]
            }
          },
          {
            "not": {
              "required": [
                "capture"
              ]
            }
          }
        ]
      }
    },
    {
      "if": {
        "properties": {
          "kind": {
            "const": "capture"
          }
        }
      },
      "then": {
        "required": [
          "capture"
        ],
        "allOf": [
          {
            "not": {
              "required": [
                "command_id"
              ]
            }
          },
          {
            "not": {
              "required": [
                "feedback"
              ]
            }
          }
        ]
      }
    },
    {
      "if": {
        "properties": {
          "empty": {
            "const": true
          }
        }
      },
      "then": {
        "properties": {
          "record_count": {
            "const": 0
          },
          "days": {
            "maxItems": 0
          }
        }
      },
      "else": {
        "properties": {
          "record_count": {
            "minimum": 1
          },
          "days": {
            "minItems": 1
          }
        }
      }
    }
  ],
  "$defs": {
    "id": {
      "description": "16 bytes as 32 lowercase hex digits (section 5).",
      "type": "string",
      "pattern": "^[0-9a-f]{32}(?![\\s\\S])"
    },
    "timestamp": {
      "description": "RFC 3339 UTC with exactly six fractional digits (section 13). The date must exist (no 2026-02-30); the pattern bounds each field.",
      "type": "string",
      "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\\.[0-9]{6}Z(?![\\s\\S])"
    },
    "uid": {
      "description": "1 to 256 bytes of UTF-8 with no control character (section 5). The byte length is checked by the receiver; 256 characters bound it here.",
      "type": "string",
      "minLength": 1,
      "maxLength": 256,
      "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+(?![\\s\\S])"
    },
    "typeName": {
      "description": "A log type name (section 10).",
      "type": "string",
      "pattern": "^[a-z0-9._-]{1,64}(?![\\s\\S])"
    },
    "levelName": {
      "enum": [
        "trace",
        "debug",
        "info",
        "notice",
        "warning",
        "error",
        "critical"
      ]
    },
    "filter": {
      "description": "What the agent selected: for a pull, the command's filter with uid set to target.uid when the target names a user (section 10); for feedback, the feedback's uid and its time range; for a capture, its window and its uid when it names one (section 21); absent fields did not filter.",
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "since": {
          "$ref": "#/$defs/timestamp"
        },
        "until": {
          "$ref": "#/$defs/timestamp"
        },
        "uid": {
          "$ref": "#/$defs/uid"
        },
        "types": {
          "type": "array",
          "uniqueItems": true,
          "items": {
            "$ref": "#/$defs/typeName"
          }
        },
        "levels": {
          "type": "array",
          "uniqueItems": true,
          "items": {
            "$ref": "#/$defs/levelName"
          }
        },
        "text": {
          "type": "string",
          "pattern": "^[^\\u0000]*(?![\\s\\S])"
        }
      }
    },
    "day": {
      "type": "object",
      "required": [
        "file",
        "records",
        "bytes",
        "first",
        "last"
      ],
      "properties": {
        "file": {
          "type": "string",
          "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])\\.jsonl(?![\\s\\S])"
        },
        "records": {
          "type": "integer",
          "minimum": 1
        },
        "bytes": {
          "type": "integer",
          "minimum": 1
        },
        "first": {
          "$ref": "#/$defs/timestamp"
        },
        "last": {
          "$ref": "#/$defs/timestamp"
        }
      }
    },
    "context": {
      "description": "Where records came from: the records' context field is the key of one of these.",
      "type": "object",
      "required": [
        "host",
        "os",
        "app",
        "appVersion",
        "process"
      ],
      "properties": {
        "host": {
          "type": "string"
        },
        "os": {
          "type": "string"
        },
        "app": {
          "type": "string"
        },
        "appVersion": {
          "type": "string"
        },
        "process": {
          "type": "string"
        },
        "extra": {
          "type": "object",
          "additionalProperties": {
            "type": "string"
          }
        }
      }
    },
    "loss": {
      "description": "Records the device lost in the filter's time range. reason: retention.age, retention.size, queue.full or write.failed; a reader shows an unknown reason as it is.",
      "type": "object",
      "required": [
        "reason",
        "count",
        "first",
        "last",
        "recorded_at"
      ],
      "properties": {
        "reason": {
          "type": "string",
          "pattern": "^[a-z][a-z0-9._-]{0,63}(?![\\s\\S])"
        },
        "count": {
          "type": "integer",
          "minimum": 0
        },
        "first": {
          "$ref": "#/$defs/timestamp"
        },
        "last": {
          "$ref": "#/$defs/timestamp"
        },
        "recorded_at": {
          "$ref": "#/$defs/timestamp"
        }
      }
    },
    "feedback": {
      "type": "object",
      "required": [
        "feedback_id",
        "uid",
        "text",
        "created_at"
      ],
      "properties": {
        "feedback_id": {
          "$ref": "#/$defs/id"
        },
        "uid": {
          "$ref": "#/$defs/uid"
        },
        "text": {
          "type": "string",
          "minLength": 1,
          "maxLength": 16384
        },
        "created_at": {
          "$ref": "#/$defs/timestamp"
        }
      }
    },
    "capture": {
      "description": "What fired a capture (section 21): the trigger, the version of the set it was matched under, whether a run's unclean end fired it, when, and (unless crash) the record that fired it, as a section 13 record object.",
      "type": "object",
      "required": [
        "trigger_id",
        "set_version",
        "crash",
        "matched_at"
      ],
      "properties": {
        "trigger_id": {
          "$ref": "#/$defs/id"
        },
        "set_version": {
          "type": "integer",
          "minimum": 1
        },
        "crash": {
          "type": "boolean"
        },
        "matched_at": {
          "$ref": "#/$defs/timestamp"
        },
        "match": {
          "type": "object",
          "required": [
            "ts",
            "level",
            "type",
            "message"
          ],
          "properties": {
            "ts": {
              "$ref": "#/$defs/timestamp"
            },
            "level": {
              "$ref": "#/$defs/levelName"
            },
            "type": {
              "$ref": "#/$defs/typeName"
            },
            "message": {
              "type": "string"
            }
          }
        }
      },
      "if": {
        "properties": {
          "crash": {
            "const": true
          }
        }
      },
      "then": {
        "not": {
          "required": [
            "match"
          ]
        }
      },
      "else": {
        "required": [
          "match"
        ]
      }
    }
  }
}

"""#

    /// Compiled once; a schema this validator cannot take is a fault of this build (the tests
    /// catch it), reported on every manifest rather than trapping.
    static let compiled: Result<JSONSchema, JSONSchema.SchemaError> = Result { try JSONSchema(json: Array(text.utf8)) }
        .mapError { $0 as? JSONSchema.SchemaError ?? JSONSchema.SchemaError(description: "\($0)") }

    /// Why `json` is not a valid manifest (each rule it breaks, with the JSON Pointer of the
    /// value), or an empty list.
    public static func problems(_ json: [UInt8]) -> [String] {
        switch compiled {
        case .success(let schema): schema.violations(in: json).map(\.description)
        case .failure(let error): ["the manifest schema does not compile: \(error)"]
        }
    }
}
