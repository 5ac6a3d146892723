//! Code generation for one probe site: the `asm!` template that emits the `nop`, the
//! `.note.stapsdt` note, the per-probe semaphore, and the linkme registry entry.
//!
//! # The note, as the assembler lays it out
//!
//! One ELF note per probe site, in the non-allocated section `.note.stapsdt` (the format of
//! SystemTap's `sys/sdt.h`, read by gdb, perf, bpftrace/libbpf and SystemTap):
//!
//! ```text
//! u32 namesz = 8          length of "stapsdt\0"
//! u32 descsz              length of the descriptor below
//! u32 type = 3            NT_STAPSDT
//! "stapsdt\0"             owner, padded to 4 bytes
//! u64 pc                  address of the probe's nop
//! u64 base                address of _.stapsdt.base, to detect prelink-style relocation
//! u64 semaphore           address of the probe's u16 semaphore (0 if none)
//! "provider\0name\0args\0"   args: space separated "[-]N@LOCATION"
//! padding to 4 bytes
//! ```
//!
//! Three things make it survive rust-lld (see FACTS.md): `.stapsdt.base` is retained (`R`) and
//! executable; `.probes` is page-aligned so that the kernel's semaphore increment hits the page
//! the program reads; the note is `SHF_LINK_ORDER` to the site's code so that `--gc-sections`
//! drops the note together with dead code instead of leaving a note with pc 0.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::Expr;

/// The most arguments a USDT note may describe (a limit of the tools that read them).
pub const MAX_ARGS: usize = 12;

/// What the generated code does at the site.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Evaluate the arguments and execute the `nop`, every time.
    Eager,
    /// Evaluate the arguments and execute the `nop` only while the semaphore is non-zero.
    Lazy,
    /// Only read the semaphore: `true` while a tracer is attached.
    Enabled,
}

/// Provider and name must be plain C identifiers: the tools split the note on NUL and match
/// `provider:name` patterns, and the semaphore's symbol is built from them.
pub fn check_name(s: &str, span: Span, what: &str) -> syn::Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(syn::Error::new(
            span,
            format!("probe {what} `{s}` must be 1 to 64 ASCII letters, digits or `_`, not starting with a digit"),
        ))
    }
}

/// The semaphore's symbol: one per `provider:name` in each linked object. `.` cannot occur in a
/// Rust identifier, so the name is unambiguous.
fn semaphore_symbol(provider: &str, name: &str) -> String {
    format!("__selftrace_sem.{provider}.{name}")
}

/// Assembler text that defines, once per object, `_.stapsdt.base`, the page alignment of
/// `.probes`, and this probe's semaphore. Each definition is guarded by `.ifndef` (once per
/// assembler run, i.e. codegen unit) and sits in a COMDAT group (once per linked object).
fn definitions(sem: &str) -> String {
    format!(
        r#"
    // _.stapsdt.base: one byte whose address every note records, once per object.
    .ifndef _.stapsdt.base
    // Retained (R) against --gc-sections, executable (x) so that perf's file-offset arithmetic
    // lands in the right segment under rust-lld, in a COMDAT group so that one copy survives.
    .pushsection .stapsdt.base,"axGR",@progbits,.stapsdt.base,comdat
    // Weak and hidden: every codegen unit and crate defines it, the linker keeps one per object.
    .weak _.stapsdt.base
    .hidden _.stapsdt.base
    // The symbol itself, one byte long.
_.stapsdt.base:
    .space 1
    .popsection
    .endif
    // Page-align `.probes`, once per object: rust-lld otherwise maps its page twice (RELRO and
    // data) and a semaphore raised by the kernel before exec is invisible to the program.
    .ifndef __selftrace_probes_align
    // Zero-size, writable, retained, COMDAT: only its alignment matters.
    .pushsection .probes,"awGR",@progbits,__selftrace_probes_align,comdat
    // The alignment the output section inherits.
    .balign 4096
    // Weak hidden marker so that the .ifndef above sees it in later sites.
    .weak __selftrace_probes_align
    .hidden __selftrace_probes_align
__selftrace_probes_align:
    .popsection
    .endif
    // This probe's semaphore: a u16 in `.probes`, shared by every site of the probe in the
    // object (sites in other crates define the same COMDAT group; the linker keeps one).
    .ifndef {sem}
    // Writable, file-backed (progbits, not bss), retained, COMDAT keyed by the symbol.
    .pushsection .probes,"awGR",@progbits,{sem},comdat
    // Weak and hidden: one definition per object, never exported to other objects.
    .weak {sem}
    .hidden {sem}
    // The kernel increments it as a u16.
    .balign 2
{sem}:
    // Zero: no tracer attached.
    .2byte 0
    .popsection
    .endif
"#
    )
}

/// Assembler text of one site: the `nop` and its note. `args` is the argument-spec text, one
/// entry per argument, already containing the `{kN}`, `{zN}`, `{rN}` operand placeholders.
fn site_asm(provider: &str, name: &str, sem: &str, nargs: usize) -> String {
    let mut args = String::new();
    for i in 0..nargs {
        if i > 0 {
            // Arguments are separated by one space.
            args.push_str("    .ascii \" \"\n");
        }
        args.push_str(&format!(
            r#"    // Argument {i}: one register ("[-]size@%reg"), or for &str/&[u8] two
    // 8-byte words (pointer, length) in memory that register points to.
    .if {{k{i}}} == 1
    .ascii "{{z{i}}}@{{r{i}}}"
    .else
    .ascii "8@0({{r{i}}}) 8@8({{r{i}}})"
    .endif
"#
        ));
    }
    format!(
        r#"
    // A per-codegen-unit counter gives every site a unique label.
    .ifndef __selftrace_site_counter
    .set __selftrace_site_counter, 0
    .endif
    .set __selftrace_site_counter, __selftrace_site_counter + 1
    // altmacro lets `%(expr)` pass the counter's value as text to the macro below.
    .altmacro
    // The site, parameterized by its unique number.
    .macro __selftrace_site n
    // The probe's address: the label the note and the section link-order name.
.L__selftrace_site\n:
    // The probe itself: a single one-byte nop, replaced by int3 when a tracer attaches.
    nop
    // The note, SHF_LINK_ORDER (o) to this site's code section and in its group (?), so that
    // --gc-sections removes it with dead code.
    .pushsection .note.stapsdt,"o?","note",.L__selftrace_site\n
    // Notes are 4-byte aligned.
    .balign 4
    // namesz: length of "stapsdt\0".
    .4byte 992f - 991f
    // descsz: from pc to the end of the argument string.
    .4byte 994f - 993f
    // type: NT_STAPSDT.
    .4byte 3
    // The owner name.
991:
    .asciz "stapsdt"
    // The descriptor starts 4-byte aligned.
992:
    .balign 4
993:
    // pc: the nop above.
    .8byte .L__selftrace_site\n
    // base: the address of _.stapsdt.base as linked.
    .8byte _.stapsdt.base
    // semaphore: this probe's shared u16.
    .8byte {sem}
    // provider and name.
    .asciz "{provider}"
    .asciz "{name}"
{args}    // Terminates the argument string.
    .byte 0
994:
    // The next note starts 4-byte aligned.
    .balign 4
    .popsection
    .endm
    // Expand the site with the counter's current value, then forget the macro so that the
    // next site can define it again.
    __selftrace_site %(__selftrace_site_counter)
    .purgem __selftrace_site
    .noaltmacro
"#
    )
}

/// Generates the code of one site.
pub fn generate(
    krate: &TokenStream,
    provider: &str,
    name: &str,
    args: &[Expr],
    mode: Mode,
) -> TokenStream {
    let sem = semaphore_symbol(provider, name);
    let defs = definitions(&sem);
    let usdt = quote!(#krate::usdt);

    let enabled = {
        let load = format!("{defs}\n    // Read the semaphore.\n    movzwl {sem}(%rip), {{0:e}}\n");
        quote! {{
            let __selftrace_sem: u32;
            // SAFETY: the asm only defines data and reads the u16 semaphore it defines; it
            // touches no other memory, no stack and no flags.
            unsafe {
                ::core::arch::asm!(#load, out(reg) __selftrace_sem,
                    options(att_syntax, nostack, preserves_flags, readonly));
            }
            __selftrace_sem != 0
        }}
    };

    // The registry entry: every site registers provider, name and where its semaphore is.
    let fires = mode != Mode::Enabled;
    let registry = {
        let lea = format!("{defs}\n    // The semaphore's address.\n    leaq {sem}(%rip), {{0}}\n");
        quote! {
            #[#usdt::__private::linkme::distributed_slice(#usdt::__private::PROBE_SITES)]
            #[linkme(crate = #usdt::__private::linkme)]
            static __SELFTRACE_SITE: #usdt::__private::Site = #usdt::__private::Site {
                provider: #provider,
                name: #name,
                fires: #fires,
                semaphore: {
                    fn __selftrace_semaphore() -> *const u16 {
                        let p: *const u16;
                        // SAFETY: computes an address; reads no memory.
                        unsafe {
                            ::core::arch::asm!(#lea, out(reg) p,
                                options(att_syntax, nostack, preserves_flags, nomem));
                        }
                        p
                    }
                    __selftrace_semaphore
                },
            };
        }
    };

    if mode == Mode::Enabled {
        return quote! {{ #registry #enabled }};
    }

    let n = args.len();
    let tys: Vec<_> = (0..n).map(|i| format_ident!("A{}", i)).collect();
    let vals: Vec<_> = (0..n).map(|i| format_ident!("a{}", i)).collect();
    let slots: Vec<_> = (0..n).map(|i| format_ident!("s{}", i)).collect();
    let ks: Vec<_> = (0..n).map(|i| format_ident!("k{}", i)).collect();
    let zs: Vec<_> = (0..n).map(|i| format_ident!("z{}", i)).collect();
    let rs: Vec<_> = (0..n).map(|i| format_ident!("r{}", i)).collect();
    let template = format!("{defs}{}", site_asm(provider, name, &sem, n));
    let total = if n == 0 {
        quote!(0usize)
    } else {
        quote!(#(<#tys as #usdt::ProbeArg>::__WORDS)+*)
    };
    let call_args = args.iter().map(|e| quote_spanned!(e.span()=> &(#e)));
    let fire = quote! {
        #[inline(always)]
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::needless_borrow)]
        fn __selftrace_fire<#(#tys: #usdt::ProbeArg + ?Sized),*>(#(#vals: &#tys),*) {
            const {
                ::core::assert!(#total <= 12, "a USDT probe has at most 12 arguments (&str and &[u8] count as 2)");
                #( #usdt::__private::check_size(<#tys as #usdt::ProbeArg>::SIZE); )*
            }
            #( let #slots: [u64; 2] = #usdt::ProbeArg::__probe_words(#vals); )*
            // SAFETY: the asm executes a nop and emits data into other sections; it reads at most
            // the 16-byte slots it is given pointers to (for &str/&[u8]), which live until the
            // end of this function, and touches no stack and no flags.
            unsafe {
                ::core::arch::asm!(
                    #template,
                    #( #ks = const <#tys as #usdt::ProbeArg>::__WORDS, )*
                    #( #zs = const <#tys as #usdt::ProbeArg>::SIZE, )*
                    #( #rs = in(reg) if <#tys as #usdt::ProbeArg>::__WORDS == 1 {
                        #slots[0]
                    } else {
                        &#slots as *const [u64; 2] as u64
                    }, )*
                    options(att_syntax, nostack, preserves_flags, readonly)
                );
            }
        }
    };
    match mode {
        Mode::Eager => quote! {{
            #registry
            #fire
            __selftrace_fire(#(#call_args),*);
        }},
        Mode::Lazy => quote! {{
            #registry
            #fire
            if #enabled {
                __selftrace_fire(#(#call_args),*);
            }
        }},
        Mode::Enabled => unreachable!(),
    }
}
