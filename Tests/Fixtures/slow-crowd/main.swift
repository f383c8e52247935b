#if canImport(Glibc)
import Glibc
#endif
import Synchronization

// A crowd of slow clients in a process of its own, as an attacker's host would hold them: the
// test process keeps no thousands of descriptors (every other test in it would share its table).
//
// Settings (environment): CROWD_PORT (the gateway on 127.0.0.1), CROWD_COUNT (connections),
// CROWD_FIRST (the text each sends once connected), CROWD_TRICKLE=1 (one more byte on every open
// connection each tick), CROWD_TICK_MS (default 250).
// Signals: SIGUSR1 opens new connections in place of the ones the server closed (back up to
// CROWD_COUNT); SIGUSR2 shuts every connection down; SIGTERM ends the process.
// Output, one line each: `opened N` once, then every tick `tick T open N last1000 M`: how many the
// server has not closed, of all and of the last 1,000 opened.

let refillRequested = Atomic<Bool>(false)
let shutdownRequested = Atomic<Bool>(false)

func setting(_ name: String) -> String? { getenv(name).map { String(cString: $0) } }

func say(_ line: String) {
    print(line)
    fflush(nil)
}

/// A blocking connection to 127.0.0.1:`port` that has sent `first`; nil if refused.
func connectOne(port: UInt16, first: [UInt8]) -> Int32? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return nil }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard connected == 0 else {
        close(fd)
        return nil
    }
    _ = first.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    return fd
}

/// Whether the server still holds `fd`: nothing to read and no close (EAGAIN).
func isOpen(_ fd: Int32) -> Bool {
    var byte: UInt8 = 0
    let count = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
    return count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)
}

guard let port = setting("CROWD_PORT").flatMap(UInt16.init), let count = setting("CROWD_COUNT").flatMap(Int.init) else {
    say("CROWD_PORT and CROWD_COUNT are required")
    exit(2)
}
let first = Array((setting("CROWD_FIRST") ?? "").utf8)
let trickle = setting("CROWD_TRICKLE") == "1"
let tick = UInt32(setting("CROWD_TICK_MS").flatMap(Int.init) ?? 250)

// A process spawned from a thread that blocks signals (as the test process's pool threads do)
// starts with them blocked: unblock the ones this one answers.
var answered = sigset_t()
sigemptyset(&answered)
for number in [SIGUSR1, SIGUSR2, SIGTERM] { sigaddset(&answered, number) }
pthread_sigmask(SIG_UNBLOCK, &answered, nil)
signal(SIGUSR1) { _ in refillRequested.store(true, ordering: .relaxed) }
signal(SIGUSR2) { _ in shutdownRequested.store(true, ordering: .relaxed) }

// Each slot: its descriptor, and whether the server has closed it (then it is closed here too).
var slots: [(fd: Int32, open: Bool)] = []
for _ in 0..<count {
    if let fd = connectOne(port: port, first: first) { slots.append((fd, true)) }
}
say("opened \(slots.count)")

var ticks = 0
while true {
    usleep(tick * 1000)
    if shutdownRequested.exchange(false, ordering: .relaxed) {
        for slot in slots where slot.open { shutdown(slot.fd, Int32(SHUT_RDWR)) }
    }
    if refillRequested.exchange(false, ordering: .relaxed) {
        for index in slots.indices where !slots[index].open {
            if let fd = connectOne(port: port, first: first) { slots[index] = (fd, true) }
        }
    }
    for index in slots.indices where slots[index].open {
        if trickle { _ = send(slots[index].fd, "x", 1, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        if !isOpen(slots[index].fd) {
            close(slots[index].fd)
            slots[index].open = false
        }
    }
    ticks += 1
    let open = slots.filter(\.open).count
    let lastOpen = slots.suffix(1000).filter(\.open).count
    say("tick \(ticks) open \(open) last1000 \(lastOpen)")
}
