import MessageMacroExpansions
import SwiftCompilerPlugin
import SwiftSyntax
import SwiftSyntaxMacros

// The compiler plugin behind `@BinaryMessage` and `@DefaultWhenAbsent`. The compiler asks it for
// `MessageMacros.BinaryMessageMacro` and `MessageMacros.DefaultWhenAbsentMacro` (the
// `#externalMacro`s in Shared/BinaryWire/BinaryMessage.swift), found by their full names in this
// module; each hands the expansion to the library `MessageMacroExpansions`, which the tests
// import (Package.swift, above the macro target, says why the two are apart).

@main
struct MessageMacrosPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [BinaryMessageMacro.self, DefaultWhenAbsentMacro.self]
}

public struct BinaryMessageMacro: ExtensionMacro, MemberMacro {
    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax, providingExtensionsOf type: some TypeSyntaxProtocol,
        conformingTo protocols: [TypeSyntax], in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        try BinaryMessageExpansion.expansion(
            of: node, attachedTo: declaration, providingExtensionsOf: type, conformingTo: protocols, in: context)
    }

    public static func expansion(
        of node: AttributeSyntax, providingMembersOf declaration: some DeclGroupSyntax, conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        try BinaryMessageExpansion.expansion(of: node, providingMembersOf: declaration, conformingTo: protocols, in: context)
    }
}

public struct DefaultWhenAbsentMacro: PeerMacro {
    public static func expansion(
        of node: AttributeSyntax, providingPeersOf declaration: some DeclSyntaxProtocol, in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        try DefaultWhenAbsentExpansion.expansion(of: node, providingPeersOf: declaration, in: context)
    }
}
