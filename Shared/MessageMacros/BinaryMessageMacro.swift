import SwiftSyntax
import SwiftSyntaxMacros

/// `@BinaryMessage`: a message's `BinaryDirectCodable` conformance, generated from its
/// declaration (`Shared/BinaryWire/BinaryMessage.swift` says what it promises).
///
/// The generated code calls only `BinaryFieldWriter.write(name, value)`,
/// `BinaryFieldValue.decode(T.self)` and `optional(T.self)`; their overloads pick each type's
/// direct path, so the macro needs nothing but the declared types' spelling.
public struct BinaryMessageMacro: ExtensionMacro, MemberMacro {
    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax, providingExtensionsOf type: some TypeSyntaxProtocol,
        conformingTo protocols: [TypeSyntax], in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        let access = accessLevel(of: declaration)
        let body: String
        if let structDecl = declaration.as(StructDeclSyntax.self) {
            body = try structCoders(Message.fields(of: structDecl), access: access)
        } else if let enumDecl = declaration.as(EnumDeclSyntax.self) {
            body = try enumCoders(Message.cases(of: enumDecl), access: access)
        } else {
            throw MacroError("@BinaryMessage applies to a struct or an enum")
        }
        let conformance = protocols.isEmpty ? "" : ": BinaryDirectCodable"
        let decl: DeclSyntax = "extension \(type.trimmed)\(raw: conformance) {\n\(raw: body)\n}"
        guard let extensionDecl = decl.as(ExtensionDeclSyntax.self) else { throw MacroError("could not form the extension") }
        return [extensionDecl]
    }

    /// `init(from:)` for `Codable`, when a field has a default: the default is then declared
    /// once, on the field, for both forms.
    public static func expansion(
        of node: AttributeSyntax, providingMembersOf declaration: some DeclGroupSyntax, conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard let structDecl = declaration.as(StructDeclSyntax.self) else { return [] }
        let fields = try Message.fields(of: structDecl)
        guard fields.contains(where: { $0.defaultValue != nil }) else { return [] }
        var lines = ["let container = try decoder.container(keyedBy: CodingKeys.self)"]
        for field in fields {
            let key = "forKey: .\(field.name)"
            if let defaultValue = field.defaultValue {
                lines.append("self.\(field.name) = try container.decodeIfPresent(\(field.type).self, \(key)) ?? \(defaultValue)")
            } else if field.isOptional {
                lines.append("self.\(field.name) = try container.decodeIfPresent(\(field.type).self, \(key))")
            } else {
                lines.append("self.\(field.name) = try container.decode(\(field.type).self, \(key))")
            }
        }
        let decl: DeclSyntax = """
            \(raw: accessLevel(of: declaration))init(from decoder: any Decoder) throws {
            \(raw: lines.map { "    " + $0 }.joined(separator: "\n"))
            }
            """
        return [decl]
    }

    /// `writeBinary` and `init(binary:)` of a struct.
    private static func structCoders(_ fields: [Message.Field], access: String) throws -> String {
        let writes = fields.map { "    fields.write(\"\($0.key)\", self.\($0.name))" }
        let reads = fieldReads(fields, reader: "fields", local: { "_\($0.name)" })
        let assignments = fields.map { field in "    self.\(field.name) = \(value(of: field, local: "_\(field.name)", reader: "fields"))" }
        return """
            \(access)func writeBinary(_ fields: inout BinaryFieldWriter) {
            \(writes.joined(separator: "\n"))
            }

            \(access)init(binary fields: BinaryFieldReader) throws {
            \(reads.map { "    " + $0 }.joined(separator: "\n"))
            \(assignments.joined(separator: "\n"))
            }
            """
    }

    /// `writeBinary` and `init(binary:)` of an enum, as its synthesized `Codable` writes it.
    private static func enumCoders(_ cases: [Message.Case], access: String) throws -> String {
        var writes: [String] = []
        var reads: [String] = []
        for enumCase in cases {
            if enumCase.values.isEmpty {
                writes.append("case .\(enumCase.name): fields.nested(\"\(enumCase.name)\")")
                reads.append("case \"\(enumCase.name)\": decoded.found(try value.keyed { _ -> Self in .\(enumCase.name) })")
                continue
            }
            // A case's values are bound to their `Field.name`s (`_0`, `_1`, ...), in its pattern
            // and in the reads alike.
            let bindings = enumCase.values.map { "let \($0.name)" }.joined(separator: ", ")
            let inner = enumCase.values.map { "inner.write(\"\($0.key)\", \($0.name))" }.joined(separator: "; ")
            writes.append("case .\(enumCase.name)(\(bindings)): fields.nested(\"\(enumCase.name)\") { inner in \(inner) }")
            let valueReads = fieldReads(enumCase.values, reader: "inner", local: \.name)
            let arguments = enumCase.values.map { field in
                (field.label.map { "\($0): " } ?? "") + value(of: field, local: field.name, reader: "inner")
            }
            reads.append("case \"\(enumCase.name)\":")
            reads.append("    decoded.found(try value.keyed { inner -> Self in")
            reads.append(contentsOf: valueReads.map { "        " + $0 })
            reads.append("        return .\(enumCase.name)(\(arguments.joined(separator: ", ")))")
            reads.append("    })")
        }
        return """
            \(access)func writeBinary(_ fields: inout BinaryFieldWriter) {
                switch self {
            \(writes.map { "    " + $0 }.joined(separator: "\n"))
                }
            }

            \(access)init(binary fields: BinaryFieldReader) throws {
                var decoded = BinaryEnumCase<Self>()
                try fields.forEach { key, value in
                    switch key {
            \(reads.map { "        " + $0 }.joined(separator: "\n"))
                    default: break
                    }
                }
                self = try decoded.value(of: Self.self, fields)
            }
            """
    }

    /// Reads every field of a keyed container into a local optional of its own.
    private static func fieldReads(_ fields: [Message.Field], reader: String, local: (Message.Field) -> String) -> [String] {
        var lines = fields.map { "var \(local($0)): \($0.type)? = nil" }
        lines.append("try \(reader).forEach { key, value in")
        lines.append("    switch key {")
        for field in fields {
            let read = field.isOptional || field.defaultValue != nil ? "optional" : "decode"
            lines.append("    case \"\(field.key)\": \(local(field)) = try value.\(read)(\(field.type).self)")
        }
        lines.append("    default: break")
        lines.append("    }")
        lines.append("}")
        return lines
    }

    /// A field's value once read: its default, nil, or the `Codable` error for a missing field.
    private static func value(of field: Message.Field, local: String, reader: String) -> String {
        if let defaultValue = field.defaultValue { return "\(local) ?? \(defaultValue)" }
        if field.isOptional { return local }
        return "try \(reader).required(\(local), \"\(field.key)\")"
    }

    private static func accessLevel(of declaration: some DeclGroupSyntax) -> String {
        for modifier in declaration.modifiers {
            switch modifier.name.tokenKind {
            case .keyword(.public), .keyword(.open): return "public "
            case .keyword(.package): return "package "
            default: continue
            }
        }
        return ""
    }
}

/// `@DefaultWhenAbsent`: read by `@BinaryMessage`; adds nothing itself.
public struct DefaultWhenAbsentMacro: PeerMacro {
    public static func expansion(
        of node: AttributeSyntax, providingPeersOf declaration: some DeclSyntaxProtocol, in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard declaration.is(VariableDeclSyntax.self) else { throw MacroError("@DefaultWhenAbsent applies to a stored property") }
        return []
    }
}

/// What a message declares, as the macros read it.
enum Message {
    struct Field {
        /// The property's name, or `_0` for an enum case's unlabelled value.
        var name: String
        /// The key it is written under.
        var key: String
        /// An enum case's label.
        var label: String?
        /// Its type, without the optional.
        var type: String
        var isOptional: Bool
        /// Its value when absent, as an expression (`self.id` for `copying: \Type.id`).
        var defaultValue: String?
    }

    struct Case {
        var name: String
        var values: [Field]
    }

    /// The fields in `Codable`'s order: the `CodingKeys` the struct declares, else its stored
    /// properties.
    static func fields(of decl: StructDeclSyntax) throws -> [Field] {
        var stored: [Field] = []
        var codingKeys: [(name: String, key: String)]?
        for member in decl.memberBlock.members {
            if let keys = member.decl.as(EnumDeclSyntax.self), keys.name.text == "CodingKeys" {
                codingKeys = keys.memberBlock.members.flatMap { member -> [(name: String, key: String)] in
                    guard let caseDecl = member.decl.as(EnumCaseDeclSyntax.self) else { return [] }
                    return caseDecl.elements.map { element in
                        let name = element.name.text
                        let raw = element.rawValue?.value.as(StringLiteralExprSyntax.self)?.representedLiteralValue
                        return (name, raw ?? name)
                    }
                }
            }
            guard let variable = member.decl.as(VariableDeclSyntax.self), isStored(variable) else { continue }
            let defaultValue = try self.defaultValue(of: variable)
            var pendingNames: [String] = []
            for binding in variable.bindings {
                guard let pattern = binding.pattern.as(IdentifierPatternSyntax.self) else {
                    throw MacroError("@BinaryMessage reads only simple stored properties")
                }
                pendingNames.append(pattern.identifier.text.trimmingBackticks)
                guard let annotation = binding.typeAnnotation else { continue }
                let (type, isOptional) = unwrapped(annotation.type)
                for name in pendingNames {
                    stored.append(Field(name: name, key: name, type: type, isOptional: isOptional, defaultValue: defaultValue))
                }
                pendingNames = []
            }
            guard pendingNames.isEmpty else { throw MacroError("@BinaryMessage needs every stored property's type written out") }
        }
        guard let codingKeys else { return stored }
        return try codingKeys.map { name, key in
            guard var field = stored.first(where: { $0.name == name }) else { throw MacroError("CodingKeys names '\(name)', which is not a stored property") }
            field.key = key
            return field
        }
    }

    static func cases(of decl: EnumDeclSyntax) throws -> [Case] {
        decl.memberBlock.members.flatMap { member -> [Case] in
            guard let caseDecl = member.decl.as(EnumCaseDeclSyntax.self) else { return [] }
            return caseDecl.elements.map { element in
                let values = (element.parameterClause?.parameters ?? []).enumerated().map { index, parameter in
                    let label = parameter.firstName.map { $0.text.trimmingBackticks }.flatMap { $0 == "_" ? nil : $0 }
                    let (type, isOptional) = unwrapped(parameter.type)
                    return Field(name: "_\(index)", key: label ?? "_\(index)", label: label, type: type, isOptional: isOptional)
                }
                return Case(name: element.name.text.trimmingBackticks, values: values)
            }
        }
    }

    /// Whether a property is stored: not static, and without accessors other than observers.
    private static func isStored(_ variable: VariableDeclSyntax) -> Bool {
        if variable.modifiers.contains(where: { [.keyword(.static), .keyword(.class)].contains($0.name.tokenKind) }) { return false }
        for binding in variable.bindings {
            switch binding.accessorBlock?.accessors {
            case .none: continue
            case .getter: return false
            case .accessors(let accessors):
                let observers: [TokenKind] = [.keyword(.willSet), .keyword(.didSet)]
                if accessors.contains(where: { !observers.contains($0.accessorSpecifier.tokenKind) }) { return false }
            }
        }
        return true
    }

    /// The expression of a property's `@DefaultWhenAbsent`, if it has one.
    private static func defaultValue(of variable: VariableDeclSyntax) throws -> String? {
        for element in variable.attributes {
            guard let attribute = element.as(AttributeSyntax.self),
                  attribute.attributeName.trimmedDescription == "DefaultWhenAbsent" else { continue }
            guard case .argumentList(let arguments) = attribute.arguments, let argument = arguments.first else {
                throw MacroError("@DefaultWhenAbsent needs a value")
            }
            if argument.label?.text == "copying" {
                guard let path = argument.expression.as(KeyPathExprSyntax.self),
                      let component = path.components.last?.component.as(KeyPathPropertyComponentSyntax.self) else {
                    throw MacroError("@DefaultWhenAbsent(copying:) takes a key path to an earlier field")
                }
                return "self.\(component.declName.baseName.text.trimmingBackticks)"
            }
            return "(\(argument.expression.trimmedDescription))"
        }
        return nil
    }

    /// A type's spelling without its optional, and whether it was optional.
    private static func unwrapped(_ type: TypeSyntax) -> (String, Bool) {
        if let optional = type.as(OptionalTypeSyntax.self) { return (optional.wrappedType.trimmedDescription, true) }
        if let identifier = type.as(IdentifierTypeSyntax.self), identifier.name.text == "Optional",
           let argument = identifier.genericArgumentClause?.arguments.first {
            return (argument.argument.trimmedDescription, true)
        }
        return (type.trimmedDescription, false)
    }
}

struct MacroError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension String {
    var trimmingBackticks: String { filter { $0 != "`" } }
}
