import SwiftCompilerPlugin
import SwiftSyntaxMacros

// The compiler plugin behind `@BinaryMessage` and `@DefaultWhenAbsent`: the compiler asks it for
// `MessageMacros.BinaryMessageMacro` and `MessageMacros.DefaultWhenAbsentMacro` (the
// `#externalMacro`s in Shared/BinaryWire/BinaryMessage.swift). Tests/SystemTests/
// MacroExpansionTests.swift has the compiler expand them through this plugin, as it builds.

@main
struct MessageMacrosPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [BinaryMessageMacro.self, DefaultWhenAbsentMacro.self]
}
