import Foundation
import Testing

/// What `@BinaryMessage` writes for each kind of field and case, as the compiler gets it: each
/// test has `swiftc` type-check a source that imports BinaryWire with the built plugin
/// (`MessageMacros-tool`, beside the test bundle) and print its expansions
/// (`-dump-macro-expansions`). The byte-for-byte tests (`BinaryDirectTests`) hold the generated
/// coders of the real messages to their `Codable` form; these show the expansion itself, so a
/// reader sees the code the compiler gets, and a change to it is seen here first.
///
/// They run the compiler rather than the macro's types in the test bundle: a test target that
/// imports swift-syntax has SwiftPM compile swift-syntax's modules a second time (for the tests,
/// besides the plugin's own), minutes of a fresh build.
@Suite("@BinaryMessage expansion")
struct MacroExpansionTests {
    /// What the compiler made of `source`: each expansion that is not empty (the member macro of a
    /// type without a `CodingKeys` adds nothing, nor does `@DefaultWhenAbsent`'s peer), and each
    /// error as "line:column: message".
    struct Expanded {
        var expansions: [String] = []
        var errors: [String] = []
    }

    static func expand(_ source: String) async throws -> Expanded {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("macro-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("Source.swift")
        try ("import BinaryWire\n" + source + "\n").write(to: file, atomically: true, encoding: .utf8)
        let built = ServiceProcess.binaryDirectory
        let (_, output) = try await ServiceProcess.runToEnd("/usr/bin/env", [
            "swiftc", "-typecheck", "-swift-version", "6", "-I", built.appendingPathComponent("Modules").path,
            "-load-plugin-executable", built.appendingPathComponent("MessageMacros-tool").path + "#MessageMacros",
            "-Xfrontend", "-dump-macro-expansions", file.path,
        ], within: .seconds(120))
        var expanded = Expanded()
        // An expansion: its buffer's name, a rule, its text, a rule. An error: its place in the
        // source (one line below the source's own, for the import), then the line's context.
        let rule = "------------------------------"
        var lines = output.split(separator: "\n", omittingEmptySubsequences: false)[...]
        while let line = lines.popFirst() {
            if line.hasPrefix("@__swiftmacro_"), lines.first == Substring(rule) {
                lines.removeFirst()
                var text: [Substring] = []
                while let next = lines.popFirst(), next != Substring(rule) { text.append(next) }
                let joined = text.joined(separator: "\n")
                if !joined.isEmpty { expanded.expansions.append(joined) }
            } else if line.hasPrefix(file.path + ":"), let error = line.range(of: ": error: ") {
                let place = line[line.index(line.startIndex, offsetBy: file.path.count + 1)..<error.lowerBound].split(separator: ":")
                let message = line[error.upperBound...].replacingOccurrences(of: " (from macro 'BinaryMessage')", with: "")
                expanded.errors.append("\((Int(place[0]) ?? 0) - 1):\(place[1]): \(message)")
            }
        }
        if expanded.expansions.isEmpty && expanded.errors.isEmpty {
            Issue.record("swiftc expanded nothing and reported no error: \(output)")
        }
        return expanded
    }

    @Test func aStructWritesItsStoredFieldsInOrderAndReadsThemInAnyOrder() async throws {
        let expanded = try await Self.expand("""
            @BinaryMessage
            public struct Sample: Codable {
                public static let limit = 3
                public var id: String
                public var note: String?
                public var tags: [String]
                public var count: Int { tags.count }
            }
            """)
        #expect(expanded.errors == [])
        #expect(expanded.expansions == ["""
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
            """])
    }

    @Test func codingKeysChooseTheFieldsAndADefaultAlsoWritesTheCodableInit() async throws {
        let expanded = try await Self.expand("""
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
            """)
        #expect(expanded.errors == [])
        // (The member, the Codable init, and the extension, in whichever order the compiler
        // expanded them.)
        #expect(expanded.expansions.sorted() == ["""
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
            """, """
            init(from decoder: any Decoder) throws {
                let container = try decoder.container(keyedBy: CodingKeys.self)
                self.id = try container.decode(String.self, forKey: .id)
                self.title = try container.decodeIfPresent(String.self, forKey: .title) ?? self.id
                self.credits = try container.decodeIfPresent(Int.self, forKey: .credits) ?? (1)
            }
            """])
    }

    @Test func anEnumWritesEachCaseAsSynthesizedCodableDoes() async throws {
        let expanded = try await Self.expand("""
            @BinaryMessage
            enum Signal: Codable {
                case stop
                case move(Int, speed: Double?)
            }
            """)
        #expect(expanded.errors == [])
        #expect(expanded.expansions == ["""
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
            """])
    }

    @Test func whatItCannotReadIsACompileErrorNotWrongBytes() async throws {
        let untyped = try await Self.expand("""
            @BinaryMessage
            struct Untyped: Codable {
                var id = "a"
            }
            """)
        // (Once for the extension, once for the member.)
        #expect(untyped.errors == [
            "1:1: @BinaryMessage needs every stored property's type written out",
            "1:1: @BinaryMessage needs every stored property's type written out",
        ])
        #expect(untyped.expansions == [])
        let box = try await Self.expand("""
            @BinaryMessage
            final class Box: Codable {}
            """)
        #expect(box.errors.contains("1:1: @BinaryMessage applies to a struct or an enum"), "\(box.errors)")
        #expect(box.expansions == [])
    }
}
