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
//! Three things make it survive rust-lld (each verified by the tests with bpftrace, perf and the
//! kernel): `.stapsdt.base` is retained (`R`) and
//! executable; `.probes` is page-aligned so that the kernel's semaphore increment hits the page
//! the program reads; the note is `SHF_LINK_ORDER` to the site's code so that `--gc-sections`
//! drops the note together with dead code instead of leaving a note with pc 0.

use crate::arch::{Target, TARGETS};
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
fn definitions(sem: &str, t: &Target) -> String {
    let progbits = t.progbits;
    let page = t.page;
    format!(
        r#"
    .ifndef _.stapsdt.base                 // once per codegen unit:
    .pushsection .stapsdt.base,"axGR",{progbits},.stapsdt.base,comdat // retained (R, against --gc-sections), executable (x, so perf's offsets land right under rust-lld), one COMDAT copy per object
    .weak _.stapsdt.base                   // every codegen unit and crate defines it...
    .hidden _.stapsdt.base                 // ...and the linker keeps one per object, not exported
_.stapsdt.base:                            // the address every note records as its base
    .space 1                               // one byte long
    .popsection                            // back to the code
    .endif                                 // end of _.stapsdt.base
    .ifndef __selftrace_probes_align       // once per codegen unit:
    .pushsection .probes,"awGR",{progbits},__selftrace_probes_align,comdat // zero-size, writable, retained, one COMDAT copy per object
    .balign {page}                         // page-aligns .probes: rust-lld otherwise maps its page twice (RELRO and data) and a semaphore raised before exec is invisible
    .weak __selftrace_probes_align         // one definition per object...
    .hidden __selftrace_probes_align       // ...not exported
__selftrace_probes_align:                  // a marker for the .ifndef above
    .popsection                            // back to the code
    .endif                                 // end of the alignment
    .ifndef {sem}                          // this probe's semaphore, once per codegen unit:
    .pushsection .probes,"awGR",{progbits},{sem},comdat // writable, file-backed (not bss), retained, COMDAT keyed by the symbol: sites in every crate of the object share one
    .weak {sem}                            // one definition per object...
    .hidden {sem}                          // ...not exported to other objects
    .balign 2                              // the kernel increments it as an aligned u16
{sem}:                                     // the semaphore
    .2byte 0                               // zero: no tracer attached
    .popsection                            // back to the code
    .endif                                 // end of the semaphore
"#
    )
}

/// Assembler text of one site: the `nop` and its note. `args` is the argument-spec text, one
/// entry per argument, already containing the `{kN}`, `{zN}`, `{rN}` operand placeholders.
fn site_asm(provider: &str, name: &str, sem: &str, nargs: usize, t: &Target) -> String {
    let mut args = String::new();
    for i in 0..nargs {
        if i > 0 {
            args.push_str("    .ascii \" \"                          // arguments are separated by one space\n");
        }
        let one = t
            .arg_reg
            .replace("{z}", &format!("{{z{i}}}"))
            .replace("{r}", &format!("{{r{i}}}"));
        let two = t.arg_pair.replace("{r}", &format!("{{r{i}}}"));
        args.push_str(&format!(
            r#"    .if {{k{i}}} == 1                    // argument {i} is one word:
    .ascii "{one}"                   // [-]size@register
    .else                                  // or two (&str, &[u8]): pointer and length
    .ascii "{two}"     // in the 16 bytes the register points to
    .endif                                 // end of argument {i}
"#
        ));
    }
    format!(
        r#"
    .ifndef __selftrace_site_counter       // a per-codegen-unit counter...
    .set __selftrace_site_counter, 0       // ...starting at 0...
    .endif                                 // ...once
    .set __selftrace_site_counter, __selftrace_site_counter + 1 // gives this site a unique number
    .altmacro                              // lets %(expr) pass the counter's value as text
    .macro __selftrace_site n              // the site, parameterized by its number
.L__selftrace_site\n:                      // the probe's address, named by the note and the link order
    nop                                    // the probe: one instruction, replaced by a breakpoint when a tracer attaches
    .pushsection .note.stapsdt,"o?","note",.L__selftrace_site\n // the note: SHF_LINK_ORDER (o) to this code, in its group (?): --gc-sections drops it with dead code
    .balign 4                              // notes are 4-byte aligned
    .4byte 992f - 991f                     // namesz: length of "stapsdt\0"
    .4byte 994f - 993f                     // descsz: from pc to the end of the argument string
    .4byte 3                               // type: NT_STAPSDT
991:                                       // start of the owner name
    .asciz "stapsdt"                       // the owner name
992:                                       // end of the owner name
    .balign 4                              // the descriptor starts 4-byte aligned
993:                                       // start of the descriptor
    .8byte .L__selftrace_site\n            // pc: the nop above
    .8byte _.stapsdt.base                  // base: the address of _.stapsdt.base as linked
    .8byte {sem}                           // semaphore: this probe's shared u16
    .asciz "{provider}"                    // provider
    .asciz "{name}"                        // name
{args}    .byte 0                                // terminates the argument string
994:                                       // end of the descriptor
    .balign 4                              // the next note starts 4-byte aligned
    .popsection                            // back to the code
    .endm                                  // end of the site macro
    __selftrace_site %(__selftrace_site_counter) // expands the site with the counter's value
    .purgem __selftrace_site               // forgets the macro: the next site defines it again
    .noaltmacro                            // back to the default macro mode
"#
    )
}

/// `options(...)` of a site's `asm!` on `t`, after the common `extra` ones.
fn options(t: &Target, extra: TokenStream) -> TokenStream {
    if t.att_syntax {
        quote!(options(att_syntax, nostack, preserves_flags, #extra))
    } else {
        quote!(options(nostack, preserves_flags, #extra))
    }
}

/// `cfg(target_arch = "...")` of `t`.
fn cfg_of(t: &Target) -> TokenStream {
    let arch = t.arch;
    quote!(target_arch = #arch)
}

/// Generates the code of one site: for each architecture of [`TARGETS`] under its
/// `cfg(target_arch)`, and for any other a site that compiles to nothing (its arguments
/// type-checked, never evaluated; not in the registry).
pub fn generate(
    krate: &TokenStream,
    provider: &str,
    name: &str,
    args: &[Expr],
    mode: Mode,
) -> TokenStream {
    let sem = semaphore_symbol(provider, name);
    let usdt = quote!(#krate::usdt);
    let archs: Vec<TokenStream> = TARGETS.iter().map(|t| cfg_of(t)).collect();
    let elsewhere = quote!(not(any(#(#archs),*)));

    let enabled = {
        let per_arch = TARGETS.iter().map(|t| {
            let load = format!("{}\n{}", definitions(&sem, t), (t.load)(&sem));
            let cfg = cfg_of(t);
            let opts = options(t, quote!(readonly));
            quote! {
                // In a function of its own so that `allow(unsafe_code)` covers the asm in crates
                // that deny unsafe code.
                #[cfg(#cfg)]
                #[inline(always)]
                #[allow(unsafe_code)]
                fn __selftrace_enabled() -> bool {
                    let sem: u64;
                    // SAFETY: the asm only defines data and reads the u16 semaphore it defines;
                    // it touches no other memory, no stack and no flags.
                    unsafe {
                        ::core::arch::asm!(#load, out(reg) sem, #opts);
                    }
                    sem as u16 != 0
                }
            }
        });
        quote! {{
            #(#per_arch)*
            /// No USDT notes on this architecture: never enabled.
            #[cfg(#elsewhere)]
            #[inline(always)]
            fn __selftrace_enabled() -> bool {
                false
            }
            __selftrace_enabled()
        }}
    };

    // The registry entry: every site registers provider, name and where its semaphore is.
    let fires = mode != Mode::Enabled;
    let registry = TARGETS.iter().map(|t| {
        let lea = format!("{}\n{}", definitions(&sem, t), (t.lea)(&sem));
        let cfg = cfg_of(t);
        let opts = options(t, quote!(nomem));
        quote! {
            #[cfg(#cfg)]
            #[#usdt::__private::linkme::distributed_slice(#usdt::__private::PROBE_SITES)]
            #[linkme(crate = #usdt::__private::linkme)]
            static __SELFTRACE_SITE: #usdt::__private::Site = #usdt::__private::Site {
                provider: #provider,
                name: #name,
                fires: #fires,
                semaphore: {
                    #[allow(unsafe_code)]
                    fn __selftrace_semaphore() -> *const u16 {
                        let p: *const u16;
                        // SAFETY: computes an address; reads no memory.
                        unsafe {
                            ::core::arch::asm!(#lea, out(reg) p, #opts);
                        }
                        p
                    }
                    __selftrace_semaphore
                },
            };
        }
    });
    let registry = quote!(#(#registry)*);

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
    let total = if n == 0 {
        quote!(0usize)
    } else {
        quote!(#(<#tys as #usdt::ProbeArg>::__WORDS)+*)
    };
    let checks = quote! {
        const {
            ::core::assert!(#total <= 12, "a USDT probe has at most 12 arguments (&str and &[u8] count as 2)");
            #( #usdt::__private::check_size(<#tys as #usdt::ProbeArg>::SIZE); )*
        }
    };
    let per_arch = TARGETS.iter().map(|t| {
        let template = format!("{}{}", definitions(&sem, t), site_asm(provider, name, &sem, n, t));
        let cfg = cfg_of(t);
        let opts = options(t, quote!(readonly));
        quote! {
            #[cfg(#cfg)]
            #[inline(always)]
            #[allow(non_snake_case, unsafe_code, clippy::too_many_arguments, clippy::needless_borrow)]
            fn __selftrace_fire<#(#tys: #usdt::ProbeArg + ?Sized),*>(#(#vals: &#tys),*) {
                #checks
                #( let #slots: [u64; 2] = #usdt::ProbeArg::__probe_words(#vals); )*
                // SAFETY: the asm executes a nop and emits data into other sections; it reads at
                // most the 16-byte slots it is given pointers to (for &str/&[u8]), which live
                // until the end of this function, and touches no stack and no flags.
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
                        #opts
                    );
                }
            }
        }
    });
    let fire = quote! {
        #(#per_arch)*
        /// No USDT notes on this architecture: the arguments are type-checked, nothing runs.
        #[cfg(#elsewhere)]
        #[inline(always)]
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::needless_borrow)]
        fn __selftrace_fire<#(#tys: #usdt::ProbeArg + ?Sized),*>(#(#vals: &#tys),*) {
            #checks
            #( let _ = #vals; )*
        }
    };
    let call_args = args.iter().map(|e| quote_spanned!(e.span()=> &(#e)));
    let call = quote!(__selftrace_fire(#(#call_args),*););
    let call = if mode == Mode::Lazy {
        quote!(if #enabled { #call })
    } else {
        call
    };
    quote! {{
        #registry
        #fire
        #call
    }}
}
