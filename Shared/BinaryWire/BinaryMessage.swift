/// Generates a message's `BinaryDirectCodable` conformance from its declaration, so that a field
/// is declared once: `writeBinary` writes the fields in `Codable`'s order (the type's `CodingKeys`
/// when it declares them, else its stored properties), and `init(binary:)` reads them back, an
/// optional as `decodeIfPresent` reads it. On an enum, each case is written as its synthesized
/// `Codable` writes it (`{"case": {"_0": value, "label": value}}`).
///
/// When a property is marked `@DefaultWhenAbsent`, the macro also writes the type's
/// `init(from:)` for `Codable`, so the default is declared once for both forms.
///
/// The expansion is plain code over `BinaryFieldWriter` and `BinaryFieldValue`; to read it, ask
/// the compiler (`swift build -Xswiftc -Xfrontend -Xswiftc -dump-macro-expansions`) or see
/// `Shared/MessageMacros/BinaryMessageMacro.swift`.
@attached(extension, conformances: BinaryDirectCodable, names: named(writeBinary), named(init(binary:)))
@attached(member, names: named(init(from:)))
public macro BinaryMessage() = #externalMacro(module: "MessageMacros", type: "BinaryMessageMacro")

/// The value a field takes when a message does not carry it (a message from before the field
/// existed, or an operator's file that leaves it out), for both the `Codable` and the binary form.
@attached(peer)
public macro DefaultWhenAbsent<T>(_ value: T) = #externalMacro(module: "MessageMacros", type: "DefaultWhenAbsentMacro")

/// A field that, when absent, takes the value of an earlier field of the same message
/// (`@DefaultWhenAbsent(copying: \EffectDescription.id)`: an effect's title is its id).
@attached(peer)
public macro DefaultWhenAbsent<Root, T>(copying field: KeyPath<Root, T>) = #externalMacro(module: "MessageMacros", type: "DefaultWhenAbsentMacro")
