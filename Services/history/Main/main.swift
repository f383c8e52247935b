import ServiceKit

// The history service. For now it answers `health`; its methods arrive with their issues.
await ProcessExit.run("history") { try await BusServiceRunner.run(.history) }
