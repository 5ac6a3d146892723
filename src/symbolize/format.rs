//! Line formats, written into fixed buffers without allocation:
//!
//! * glibc's `backtrace_symbols` (`path(sym+0x1d) [0x55d0c0a3d1f0]`) and
//!   `backtrace_symbols_fd` (`path(sym+0x1d)[0x55d0c0a3d1f0]` before glibc 2.40);
//! * the kernel's `dump_stack()` / SystemTap style
//!   (`0x55d0c0a3d1f0 : my_crate::parse+0x1d/0x80 [myprog]`);
//! * Rust demangling into a caller's buffer.
//!
//! # Async-signal safety
//! Everything in this file is async-signal-safe: no allocation, no lock, no panic. Output that
//! does not fit is truncated (at a UTF-8 boundary), never an error.

use super::{lookup, lookup_frame, Mode, Symbol, SymbolName};
use crate::fmt::FixedBuf;
use crate::unwind::FrameKind;
use core::fmt;

/// Writes `name` demangled into `out`: Rust legacy and v0 names with rustc-demangle (hash
/// suffix dropped); anything else (C, C++) as it is; a symbol version (`@@GLIBC_2.34`) is
/// dropped ([`without_version`]). Never allocates.
///
/// # Async-signal safety
/// Async-signal-safe. rustc-demangle bounds its recursion, but a pathological v0 name still
/// takes up to about [`DEMANGLE_STACK`] bytes of stack (146 KiB measured for a 1 KiB v0 name in
/// a debug build): where less is left (a small alternate signal stack, a small thread), a
/// Rust name is demangled on one of selftrace's private stacks (mapped by `init()`), and when
/// none is free it is written as it is, mangled (`_R...`, `_ZN...`), which `rustfilt` or
/// `c++filt` read later.
pub fn demangle_to(name: &[u8], out: &mut FixedBuf<'_>) {
    let name = without_version(name);
    let Ok(s) = core::str::from_utf8(name) else {
        out.push_bytes(name);
        return;
    };
    let bare = s.trim_start_matches('_');
    if !(bare.starts_with('R') || bare.starts_with("ZN")) {
        // Not a Rust name (rustc-demangle takes only these): no stack needed.
        out.push_str(s);
        return;
    }
    let mut done = false;
    let ran = crate::sys::stack::with_room(DEMANGLE_STACK, &mut || {
        if let Ok(d) = rustc_demangle::try_demangle(s) {
            // FixedBuf::write_str never fails, so neither does this.
            let _ = fmt::write(out, format_args!("{d:#}"));
            done = true;
        }
    });
    if !ran || !done {
        out.push_str(s);
    }
}

/// Bytes of stack that [`demangle_to`] wants left for rustc-demangle before it demangles on
/// the caller's stack (its recursion limit, in a debug build, with room to spare).
pub const DEMANGLE_STACK: usize = 256 * 1024;

/// `name` without an ELF symbol version (`__libc_start_main@@GLIBC_2.34` ->
/// `__libc_start_main`); a PLT stub's `@plt` stays.
///
/// # Async-signal safety
/// Async-signal-safe.
pub fn without_version(name: &[u8]) -> &[u8] {
    match name.iter().position(|&b| b == b'@') {
        Some(at) if name.get(at..) != Some(&b"@plt"[..]) => name.get(..at).unwrap_or(name),
        _ => name,
    }
}

/// Longest raw name that the async-signal-safe formatters demangle: they decode it into a stack
/// buffer of this size first. A longer name (18 of the 256,600 function names of rustc's
/// `librustc_driver` and `libLLVM`) is written as it is, mangled, cut where the output ends.
pub const RAW_NAME_MAX: usize = 1024;

/// Writes symbol name `name` demangled (see [`demangle_to`]); a raw name longer than
/// [`RAW_NAME_MAX`] is written as it is.
///
/// # Async-signal safety
/// Async-signal-safe; uses [`RAW_NAME_MAX`] bytes of stack.
pub(crate) fn demangle_name_to(name: SymbolName, out: &mut FixedBuf<'_>) {
    let mut raw = [0u8; RAW_NAME_MAX];
    match name.copy_len(&mut raw) {
        n if n > RAW_NAME_MAX => push_name(out, name),
        n => demangle_to(raw.get(..n).unwrap_or(&[]), out),
    }
}

/// Writes symbol name `name` as it is (mangled).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn push_name(out: &mut FixedBuf<'_>, name: SymbolName) {
    for p in name.pieces() {
        out.push_bytes(p);
    }
}

/// Writes `name` demangled into `buf` (see [`demangle_to`]) and returns the text written.
///
/// # Async-signal safety
/// Async-signal-safe. At most [`crate::SIGNAL_STACK_BUDGET`] bytes of the caller's stack: a
/// Rust name is demangled on a private stack when less than [`DEMANGLE_STACK`] is left, and
/// written as it is (mangled) when none is free (see [`demangle_to`]).
pub fn demangle_into<'b>(name: &[u8], buf: &'b mut [u8]) -> &'b str {
    write_str_into(buf, |w| demangle_to(name, w))
}

/// Runs `write` on a [`FixedBuf`] over `buf` and returns the text it wrote.
///
/// # Async-signal safety
/// Async-signal-safe when `write` is.
pub(crate) fn write_str_into(buf: &mut [u8], write: impl FnOnce(&mut FixedBuf<'_>)) -> &str {
    let mut w = FixedBuf::new(buf);
    write(&mut w);
    let n = w.as_str().len();
    let (head, _) = buf.split_at(n.min(buf.len()));
    core::str::from_utf8(head).unwrap_or("")
}

/// Which glibc line to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GlibcLine {
    /// `backtrace_symbols`: `path(sym+0x1d) [0x...]`, `%#tx` offsets (`+0` for zero), `%p`
    /// addresses (`(nil)` for zero).
    Strings,
    /// `backtrace_symbols_fd`: `+0x` always, `[0x..]`, a space before `[` only from glibc 2.40.
    Fd {
        /// Put a space before `[` (glibc 2.40 and later).
        space: bool,
    },
}

/// Options of the glibc-compatible formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolsOptions {
    /// Demangle Rust names (and, outside signal handlers, C++ names) instead of printing the
    /// raw symbol as glibc does.
    pub demangle: bool,
    /// Name only what glibc names: exported (`.dynsym`) symbols. Off by default: then functions
    /// that are not exported are named too, from `.symtab` or a debug file.
    pub exported_only: bool,
}

/// Writes one glibc line for `addr` (without the trailing newline for [`GlibcLine::Strings`],
/// with it for [`GlibcLine::Fd`]).
///
/// # Async-signal safety
/// Async-signal-safe; C++ names stay mangled here.
pub(crate) fn glibc_line(
    out: &mut FixedBuf<'_>,
    addr: usize,
    line: GlibcLine,
    opts: SymbolsOptions,
) {
    let mode = if opts.exported_only {
        Mode::Exported
    } else {
        Mode::All
    };
    let sym = lookup(addr, mode);
    glibc_line_for(
        out,
        addr,
        sym.as_ref(),
        line,
        opts.demangle,
        &mut |out, name| demangle_name_to(name, out),
    );
}

/// The body of [`glibc_line`], with the symbol already looked up and a name writer.
pub(crate) fn glibc_line_for(
    out: &mut FixedBuf<'_>,
    addr: usize,
    sym: Option<&Symbol>,
    line: GlibcLine,
    demangle: bool,
    write_name: &mut dyn FnMut(&mut FixedBuf<'_>, SymbolName),
) {
    if let Some(why) = sym.and_then(|s| s.source.unknown_reason()) {
        // The object there is not (or may not be) the one indexed: marked, never named.
        out.push_bytes(b"??(");
        out.push_str(why);
        match line {
            GlibcLine::Strings => out.push_bytes(b") ["),
            GlibcLine::Fd { space: true } => out.push_bytes(b") [0x"),
            GlibcLine::Fd { space: false } => out.push_bytes(b")[0x"),
        }
        match line {
            GlibcLine::Strings => {
                push_pointer(out, addr);
                out.push_bytes(b"]");
            }
            GlibcLine::Fd { .. } => {
                out.push_hex(addr);
                out.push_bytes(b"]\n");
            }
        }
        return;
    }
    let described = sym.filter(|s| !s.glibc_path.is_empty());
    match (described, line) {
        (Some(s), GlibcLine::Strings) => {
            out.push_str(s.glibc_path);
            out.push_bytes(b"(");
            let base = match s.name {
                Some(name) => {
                    if demangle {
                        write_name(out, name);
                    } else {
                        push_name(out, name);
                    }
                    Some(s.start)
                }
                None => (s.bias != 0).then_some(s.bias),
            };
            if let Some(base) = base {
                let (sign, diff) = if addr >= base {
                    (b"+", addr - base)
                } else {
                    (b"-", base - addr)
                };
                out.push_bytes(sign);
                // printf's `%#tx`: no `0x` for zero.
                if diff == 0 {
                    out.push_bytes(b"0");
                } else {
                    out.push_0x(diff);
                }
            }
            out.push_bytes(b") [");
            push_pointer(out, addr);
            out.push_bytes(b"]");
        }
        (None, GlibcLine::Strings) => {
            out.push_bytes(b"[");
            push_pointer(out, addr);
            out.push_bytes(b"]");
        }
        (s, GlibcLine::Fd { space }) => {
            if let Some(s) = s.filter(|s| !s.glibc_path.is_empty()) {
                out.push_str(s.glibc_path);
                if s.name.is_some() || s.bias != 0 {
                    out.push_bytes(b"(");
                    let base = match s.name {
                        Some(name) => {
                            if demangle {
                                write_name(out, name);
                            } else {
                                push_name(out, name);
                            }
                            s.start
                        }
                        None => s.bias,
                    };
                    if addr >= base {
                        out.push_bytes(b"+0x");
                        out.push_hex(addr - base);
                    } else {
                        out.push_bytes(b"-0x");
                        out.push_hex(base - addr);
                    }
                    out.push_bytes(b")");
                }
                if space {
                    out.push_bytes(b" ");
                }
            }
            out.push_bytes(b"[0x");
            out.push_hex(addr);
            out.push_bytes(b"]\n");
        }
    }
}

/// printf's `%p`: `0x...`, or `(nil)` for zero.
fn push_pointer(out: &mut FixedBuf<'_>, addr: usize) {
    if addr == 0 {
        out.push_bytes(b"(nil)");
    } else {
        out.push_0x(addr);
    }
}

/// Options of the kernel-style format ([`write_kernel_frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOptions {
    /// Demangle Rust names (C++ names stay mangled: demangling them allocates).
    pub demangle: bool,
    /// Print the object as `[name+0x1234]` (offset from the load bias: a link-time address,
    /// what `addr2line -e` takes) instead of `[name]`.
    pub object_offset: bool,
    /// Append the object's GNU build-id inside the brackets: `[name 1a2b3c...]`, as the
    /// kernel does with `CONFIG_STACKTRACE_BUILD_ID`.
    pub build_id: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            demangle: true,
            object_offset: false,
            build_id: false,
        }
    }
}

/// Writes one frame in the kernel's `dump_stack()` / SystemTap format, without a newline:
///
/// ```text
/// 0x55d0c0a3d1f0 : my_crate::parse+0x1d/0x80 [myprog]
/// 0x7f3a2b1c0000 : +0x1234 [libfoo.so]            (object known, no symbol)
/// 0x7f3a2b1c0000 : ??                              (no object: anonymous memory, garbage)
/// ```
///
/// Offsets are from the symbol's start to `addr` itself; the symbol is looked up at
/// [`FrameKind::lookup_address`]. Returns the number of bytes written.
///
/// # Async-signal safety
/// Async-signal-safe: no allocation, no lock, no panic; a line that does not fit is cut. At
/// most [`crate::SIGNAL_STACK_BUDGET`] bytes of stack (see the crate docs' stack budget).
pub fn write_kernel_frame(
    buf: &mut [u8],
    addr: usize,
    kind: FrameKind,
    opts: KernelOptions,
) -> usize {
    let mut out = FixedBuf::new(buf);
    let sym = lookup_frame(addr, kind, Mode::All);
    kernel_frame_for(&mut out, addr, sym.as_ref(), opts);
    out.len()
}

/// ` stack truncated: no unwind rule at 0x7f3a2c1d2e40 [libfoo.so+0x2e40]`: where and why a
/// walk stopped before the outermost frame (crash reports, `dump_stack()`, thread dumps).
///
/// # Async-signal safety
/// Async-signal-safe.
pub(crate) fn write_truncation(w: &mut FixedBuf<'_>, t: &crate::unwind::Truncation) {
    w.push_bytes(b" stack truncated: ");
    w.push_str(t.reason.as_str());
    w.push_bytes(b" at ");
    w.push_0x(t.pc);
    if let Some(s) = super::symbolize(t.pc).filter(|s| !s.source.is_stale()) {
        w.push_bytes(b" [");
        w.push_str(crate::modules::short_name(s.path));
        w.push_bytes(b"+");
        w.push_0x(t.pc.wrapping_sub(s.bias));
        w.push_bytes(b"]");
    }
}

/// The body of [`write_kernel_frame`].
pub(crate) fn kernel_frame_for(
    out: &mut FixedBuf<'_>,
    addr: usize,
    sym: Option<&Symbol>,
    opts: KernelOptions,
) {
    out.push_0x(addr);
    out.push_bytes(b" : ");
    let Some(s) = sym else {
        out.push_bytes(b"??");
        return;
    };
    if let Some(why) = s.source.unknown_reason() {
        out.push_bytes(b"?? (");
        out.push_str(why);
        out.push_bytes(b")");
        return;
    }
    match s.name {
        Some(name) => {
            if opts.demangle {
                demangle_name_to(name, out);
            } else {
                push_name(out, name);
            }
            out.push_bytes(b"+");
            out.push_0x(addr.wrapping_sub(s.start));
            out.push_bytes(b"/");
            out.push_0x(s.size);
        }
        None => {
            out.push_bytes(b"+");
            out.push_0x(addr.wrapping_sub(s.bias));
        }
    }
    out.push_bytes(b" [");
    out.push_str(crate::modules::short_name(s.path));
    if opts.object_offset {
        out.push_bytes(b"+");
        out.push_0x(addr.wrapping_sub(s.bias));
    }
    if opts.build_id && !s.build_id.is_empty() {
        out.push_bytes(b" ");
        for b in s.build_id {
            let mut two = [0u8; 2];
            let hex = b"0123456789abcdef";
            two[0] = hex.get(usize::from(b >> 4)).copied().unwrap_or(b'0');
            two[1] = hex.get(usize::from(b & 0xf)).copied().unwrap_or(b'0');
            out.push_bytes(&two);
        }
    }
    out.push_bytes(b"]");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: Option<&'static [u8]>, bias: usize) -> Symbol {
        Symbol {
            addr: 0,
            path: "/bin/prog",
            glibc_path: "./prog",
            bias,
            build_id: &[0xab, 0x01],
            name: name.map(SymbolName::leaked),
            start: 0x401100,
            size: 0x40,
            source: super::super::SymbolSource::Symtab,
        }
    }

    fn glibc(addr: usize, s: Option<&Symbol>, line: GlibcLine) -> String {
        let mut b = [0u8; 256];
        let mut out = FixedBuf::new(&mut b);
        glibc_line_for(&mut out, addr, s, line, true, &mut |o, n| {
            demangle_name_to(n, o)
        });
        out.as_str().to_string()
    }

    #[test]
    fn glibc_formats_for_every_case() {
        let fd = GlibcLine::Fd { space: false };
        let fd40 = GlibcLine::Fd { space: true };
        let named = sym(Some(b"main"), 0);
        assert_eq!(
            glibc(0x401136, Some(&named), GlibcLine::Strings),
            "./prog(main+0x36) [0x401136]"
        );
        assert_eq!(
            glibc(0x401100, Some(&named), GlibcLine::Strings),
            "./prog(main+0) [0x401100]"
        );
        assert_eq!(
            glibc(0x401136, Some(&named), fd),
            "./prog(main+0x36)[0x401136]\n"
        );
        assert_eq!(
            glibc(0x401100, Some(&named), fd),
            "./prog(main+0x0)[0x401100]\n"
        );
        assert_eq!(
            glibc(0x401136, Some(&named), fd40),
            "./prog(main+0x36) [0x401136]\n"
        );
        // Non-PIE program, no symbol: empty parentheses (no parentheses at all in _fd).
        let nonpie = sym(None, 0);
        assert_eq!(
            glibc(0x401136, Some(&nonpie), GlibcLine::Strings),
            "./prog() [0x401136]"
        );
        assert_eq!(glibc(0x401136, Some(&nonpie), fd), "./prog[0x401136]\n");
        // PIE or library, no symbol: offset from the load bias.
        let pie = sym(None, 0x5500_0000_0000);
        let a = 0x5500_0000_1234;
        assert_eq!(
            glibc(a, Some(&pie), GlibcLine::Strings),
            "./prog(+0x1234) [0x550000001234]"
        );
        assert_eq!(
            glibc(a, Some(&pie), fd),
            "./prog(+0x1234)[0x550000001234]\n"
        );
        // No object.
        assert_eq!(glibc(0x10, None, GlibcLine::Strings), "[0x10]");
        assert_eq!(glibc(0, None, GlibcLine::Strings), "[(nil)]");
        assert_eq!(glibc(0, None, fd), "[0x0]\n");
        // Demangled on request.
        let rust = sym(Some(b"_ZN4core3fmt5write17h0123456789abcdefE"), 0);
        assert_eq!(
            glibc(0x401101, Some(&rust), GlibcLine::Strings),
            "./prog(core::fmt::write+0x1) [0x401101]"
        );
    }

    #[test]
    fn kernel_format_for_every_case() {
        let line = |addr, s: Option<&Symbol>, opts| {
            let mut b = [0u8; 256];
            let mut out = FixedBuf::new(&mut b);
            kernel_frame_for(&mut out, addr, s, opts);
            out.as_str().to_string()
        };
        let named = sym(Some(b"_ZN4core3fmt5write17h0123456789abcdefE"), 0x1000);
        let opts = KernelOptions::default();
        assert_eq!(
            line(0x40111d, Some(&named), opts),
            "0x40111d : core::fmt::write+0x1d/0x40 [prog]"
        );
        let all = KernelOptions {
            demangle: false,
            object_offset: true,
            build_id: true,
        };
        assert_eq!(
            line(0x40111d, Some(&named), all),
            "0x40111d : _ZN4core3fmt5write17h0123456789abcdefE+0x1d/0x40 [prog+0x40011d ab01]"
        );
        assert_eq!(
            line(0x2234, Some(&sym(None, 0x1000)), opts),
            "0x2234 : +0x1234 [prog]"
        );
        assert_eq!(line(0x10, None, opts), "0x10 : ??");
    }

    #[test]
    fn demangles_legacy_and_v0_without_hash() {
        let mut b = [0u8; 128];
        assert_eq!(
            demangle_into(b"_ZN4core3fmt5write17h0123456789abcdefE", &mut b),
            "core::fmt::write"
        );
        assert_eq!(
            demangle_into(b"_RNvCs1234_7mycrate3foo", &mut b),
            "mycrate::foo"
        );
        assert_eq!(demangle_into(b"memcpy", &mut b), "memcpy");
        assert_eq!(demangle_into(b"_ZN3foo3barEv", &mut b), "_ZN3foo3barEv");
        let mut small = [0u8; 6];
        assert_eq!(
            demangle_into(b"_ZN4core3fmt5write17h0123456789abcdefE", &mut small),
            "core::"
        );
        assert_eq!(demangle_into(b"\xff\xfe", &mut b), "");
    }
}
