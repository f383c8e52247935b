import MessageMacroExpansions
import SwiftSyntaxMacroExpansion
import SwiftSyntaxMacrosGenericTestSupport
import Testing

/// What `@BinaryMessage` writes for each kind of field and case. The byte-for-byte tests
/// (`BinaryDirectTests`) hold the generated coders of the real messages to their `Codable` form;
/// these show the expansion itself, so a reader sees the code the compiler gets, and a change to
/// it is seen here first.
@Suite("@BinaryMessage expansion")
struct BinaryMessageMacroTests {
    static let macros: [String: MacroSpec] = [
        "BinaryMessage": MacroSpec(type: BinaryMessageExpansion.self, conformances: ["BinaryDirectCodable"]),
        "DefaultWhenAbsent": MacroSpec(type: DefaultWhenAbsentExpansion.self),
    ]

    static func expand(_ source: String, _ expanded: String, diagnostics: [DiagnosticSpec] = [], line: UInt = #line) {
        assertMacroExpansion(
            source, expandedSource: expanded, diagnostics: diagnostics, macroSpecs: macros,
            failureHandler: { failure in Issue.record(Comment(rawValue: failure.message)) }, line: line
        )
    }

    @Test func aStructWritesItsStoredFieldsInOrderAndReadsThemInAnyOrder() {
        Self.expand(
            """
            @BinaryMessage
            public struct Sample: Codable {
                public static let limit = 3
                public var id: String
                public var note: String?
                public var tags: [String]
                public var count: Int { tags.count }
            }
            """,
            """
            public struct Sample: Codable {
                public static let limit = 3
                public var id: String
                public var note: String?
                public var tags: [String]
                public var count: Int { tags.count }
            }

            extension Sample: BinaryDirectCodable {
                public func writeBinary(_ fields: inout BinaryFieldWriter) {
                    fields.write("id", self.id)
                    fields.write("note", self.note)
                    fields.write("tags", self.tags)
                }

                public init(binary fields: BinaryFieldReader) throws {
                    var _id: String? = nil
                    var _note: String? = nil
                    var _tags: [String]? = nil
                    try fields.forEach { key, value in
                        switch key {
                        case "id":
                            _id = try value.decode(String.self)
                        case "note":
                            _note = try value.optional(String.self)
                        case "tags":
                            _tags = try value.decode([String].self)
                        default:
                            break
                        }
                    }
                    self.id = try fields.required(_id, "id")
                    self.note = _note
                    self.tags = try fields.required(_tags, "tags")
                }
            }
            """
        )
    }

    @Test func codingKeysChooseTheFieldsAndADefaultAlsoWritesTheCodableInit() {
        Self.expand(
            """
            @BinaryMessage
            struct Sample: Codable {
                var id: String
                @DefaultWhenAbsent(copying: \\Sample.id)
                var title: String
                @DefaultWhenAbsent(1)
                var credits: Int
                var trace: String?
                enum CodingKeys: String, CodingKey {
                    case id, title, credits = "price"
                }
            }
            """,
            """
            struct Sample: Codable {
                var id: String
                var title: String
                var credits: Int
                var trace: String?
                enum CodingKeys: String, CodingKey {
                    case id, title, credits = "price"
                }

                init(from decoder: any Decoder) throws {
                    let container = try decoder.container(keyedBy: CodingKeys.self)
                    self.id = try container.decode(String.self, forKey: .id)
                    self.title = try container.decodeIfPresent(String.self, forKey: .title) ?? self.id
                    self.credits = try container.decodeIfPresent(Int.self, forKey: .credits) ?? (1)
                }
            }

            extension Sample: BinaryDirectCodable {
                func writeBinary(_ fields: inout BinaryFieldWriter) {
                    fields.write("id", self.id)
                    fields.write("title", self.title)
                    fields.write("price", self.credits)
                }

                init(binary fields: BinaryFieldReader) throws {
                    var _id: String? = nil
                    var _title: String? = nil
                    var _credits: Int? = nil
                    try fields.forEach { key, value in
                        switch key {
                        case "id":
                            _id = try value.decode(String.self)
                        case "title":
                            _title = try value.optional(String.self)
                        case "price":
                            _credits = try value.optional(Int.self)
                        default:
                            break
                        }
                    }
                    self.id = try fields.required(_id, "id")
                    self.title = _title ?? self.id
                    self.credits = _credits ?? (1)
                }
            }
            """
        )
    }

    @Test func anEnumWritesEachCaseAsSynthesizedCodableDoes() {
        Self.expand(
            """
            @BinaryMessage
            enum Signal: Codable {
                case stop
                case move(Int, speed: Double?)
            }
            """,
            """
            enum Signal: Codable {
                case stop
                case move(Int, speed: Double?)
            }

            extension Signal: BinaryDirectCodable {
                func writeBinary(_ fields: inout BinaryFieldWriter) {
                    switch self {
                    case .stop:
                        fields.nested("stop")
                    case .move(let _0, let _1):
                        fields.nested("move") { inner in
                            inner.write("_0", _0);
                            inner.write("speed", _1)
                        }
                    }
                }

                init(binary fields: BinaryFieldReader) throws {
                    var decoded = BinaryEnumCase<Self>()
                    try fields.forEach { key, value in
                        switch key {
                        case "stop":
                            decoded.found(try value.keyed { _ -> Self in
                                    .stop
                                })
                        case "move":
                            decoded.found(try value.keyed { inner -> Self in
                                var _0: Int? = nil
                                var _1: Double? = nil
                                try inner.forEach { key, value in
                                    switch key {
                                    case "_0":
                                                        _0 = try value.decode(Int.self)
                                    case "speed":
                                                        _1 = try value.optional(Double.self)
                                    default:
                                                        break
                                    }
                                }
                                return .move(try inner.required(_0, "_0"), speed: _1)
                            })
                        default:
                            break
                        }
                    }
                    self = try decoded.value(of: Self.self, fields)
                }
            }
            """
        )
    }

    @Test func whatItCannotReadIsACompileErrorNotWrongBytes() {
        Self.expand(
            """
            @BinaryMessage
            struct Untyped: Codable {
                var id = "a"
            }
            """,
            """
            struct Untyped: Codable {
                var id = "a"
            }
            """,
            diagnostics: [
                DiagnosticSpec(message: "@BinaryMessage needs every stored property's type written out", line: 1, column: 1),
                DiagnosticSpec(message: "@BinaryMessage needs every stored property's type written out", line: 1, column: 1),
            ]
        )
        Self.expand(
            """
            @BinaryMessage
            final class Box: Codable {}
            """,
            """
            final class Box: Codable {}
            """,
            diagnostics: [DiagnosticSpec(message: "@BinaryMessage applies to a struct or an enum", line: 1, column: 1)]
        )
    }
}
