//! Names of signals and of their `si_code`s, as the kernel's headers spell them.

/// `SIGSEGV` and friends, or `None` for a signal without a conventional name here.
pub(crate) fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// The meaning of `si_code` for `sig`: `(name, description)`.
pub(crate) fn code_name(sig: i32, code: i32) -> Option<(&'static str, &'static str)> {
    // Codes every signal may carry (sent, not raised by a fault).
    let generic = match code {
        0 => Some(("SI_USER", "sent by kill()")),
        0x80 => Some(("SI_KERNEL", "sent by the kernel")),
        -1 => Some(("SI_QUEUE", "sent by sigqueue()")),
        -6 => Some(("SI_TKILL", "sent by tkill() or raise()")),
        _ => None,
    };
    if code <= 0 || code == 0x80 {
        return generic;
    }
    let specific = match (sig, code) {
        (libc::SIGSEGV, 1) => ("SEGV_MAPERR", "address not mapped to object"),
        (libc::SIGSEGV, 2) => ("SEGV_ACCERR", "invalid permissions for mapped object"),
        (libc::SIGSEGV, 3) => ("SEGV_BNDERR", "failed address bound checks"),
        (libc::SIGSEGV, 4) => ("SEGV_PKUERR", "access denied by memory protection keys"),
        (libc::SIGBUS, 1) => ("BUS_ADRALN", "invalid address alignment"),
        (libc::SIGBUS, 2) => ("BUS_ADRERR", "nonexistent physical address"),
        (libc::SIGBUS, 3) => ("BUS_OBJERR", "object-specific hardware error"),
        (libc::SIGBUS, 4) => ("BUS_MCEERR_AR", "hardware memory error consumed"),
        (libc::SIGBUS, 5) => ("BUS_MCEERR_AO", "hardware memory error detected"),
        (libc::SIGILL, 1) => ("ILL_ILLOPC", "illegal opcode"),
        (libc::SIGILL, 2) => ("ILL_ILLOPN", "illegal operand"),
        (libc::SIGILL, 3) => ("ILL_ILLADR", "illegal addressing mode"),
        (libc::SIGILL, 4) => ("ILL_ILLTRP", "illegal trap"),
        (libc::SIGILL, 5) => ("ILL_PRVOPC", "privileged opcode"),
        (libc::SIGILL, 6) => ("ILL_PRVREG", "privileged register"),
        (libc::SIGILL, 7) => ("ILL_COPROC", "coprocessor error"),
        (libc::SIGILL, 8) => ("ILL_BADSTK", "internal stack error"),
        (libc::SIGFPE, 1) => ("FPE_INTDIV", "integer divide by zero"),
        (libc::SIGFPE, 2) => ("FPE_INTOVF", "integer overflow"),
        (libc::SIGFPE, 3) => ("FPE_FLTDIV", "floating-point divide by zero"),
        (libc::SIGFPE, 4) => ("FPE_FLTOVF", "floating-point overflow"),
        (libc::SIGFPE, 5) => ("FPE_FLTUND", "floating-point underflow"),
        (libc::SIGFPE, 6) => ("FPE_FLTRES", "floating-point inexact result"),
        (libc::SIGFPE, 7) => ("FPE_FLTINV", "floating-point invalid operation"),
        (libc::SIGFPE, 8) => ("FPE_FLTSUB", "subscript out of range"),
        (libc::SIGTRAP, 1) => ("TRAP_BRKPT", "process breakpoint"),
        (libc::SIGTRAP, 2) => ("TRAP_TRACE", "process trace trap"),
        _ => return generic,
    };
    Some(specific)
}

/// Whether `sig` with `code` was raised by a fault of the interrupted instruction (so the
/// fault address means something).
pub(crate) fn is_fault(sig: i32, code: i32) -> bool {
    code > 0
        && code != 0x80
        && matches!(
            sig,
            libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP
        )
}
