//! Procedural macros for selftrace's USDT probes.
//!
//! Use them through `selftrace`, which re-exports them: `selftrace::probe!`,
//! `selftrace::probe_lazy!`, `selftrace::probe_enabled!` (declarative wrappers around
//! [`macro@__probe_site`]) and the attribute `#[selftrace::usdt::probe]` ([`macro@probe`]).
//! This crate is an implementation detail; its items are not meant to be named directly.

mod arch;
mod attr;
mod site;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, LitStr, Token};

/// A provider or probe name: an identifier or a string literal.
struct Name {
    value: String,
    span: proc_macro2::Span,
}

impl Parse for Name {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(LitStr) {
            let s: LitStr = input.parse()?;
            Ok(Name {
                value: s.value(),
                span: s.span(),
            })
        } else {
            let id: Ident = input.call(syn::ext::IdentExt::parse_any).map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "expected a probe provider or name (an identifier or a string literal)",
                )
            })?;
            Ok(Name {
                value: id.to_string().trim_start_matches("r#").to_string(),
                span: id.span(),
            })
        }
    }
}

/// `($crate) mode provider, name [, args...]`
struct SiteInput {
    krate: TokenStream2,
    mode: site::Mode,
    provider: Name,
    name: Name,
    args: Vec<Expr>,
}

impl Parse for SiteInput {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let content;
        syn::parenthesized!(content in input);
        let krate: TokenStream2 = content.parse()?;
        let mode: Ident = input.parse()?;
        let mode = match mode.to_string().as_str() {
            "eager" => site::Mode::Eager,
            "lazy" => site::Mode::Lazy,
            "enabled" => site::Mode::Enabled,
            _ => return Err(syn::Error::new(mode.span(), "unknown probe mode")),
        };
        let provider: Name = input.parse()?;
        site::check_name(&provider.value, provider.span, "provider")?;
        input.parse::<Token![,]>()?;
        let name: Name = input.parse()?;
        site::check_name(&name.value, name.span, "name")?;
        let mut args = Vec::new();
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
            let rest: Punctuated<Expr, Token![,]> = Punctuated::parse_terminated(input)?;
            args = rest.into_iter().collect();
        }
        if mode == site::Mode::Enabled && !args.is_empty() {
            return Err(syn::Error::new_spanned(
                &args[0],
                "probe_enabled! takes only a provider and a name",
            ));
        }
        if args.len() > site::MAX_ARGS {
            return Err(syn::Error::new_spanned(
                &args[site::MAX_ARGS],
                format!(
                    "a USDT probe has at most {} arguments, this one has {}",
                    site::MAX_ARGS,
                    args.len()
                ),
            ));
        }
        Ok(SiteInput {
            krate,
            mode,
            provider,
            name,
            args,
        })
    }
}

/// Implementation of `selftrace::probe!`, `probe_lazy!` and `probe_enabled!`: expands one probe
/// site. Input: `($crate) eager|lazy|enabled provider, name, args...`.
#[doc(hidden)]
#[proc_macro]
pub fn __probe_site(input: TokenStream) -> TokenStream {
    match syn::parse::<SiteInput>(input) {
        Ok(s) => site::generate(&s.krate, &s.provider.value, &s.name.value, &s.args, s.mode).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Puts USDT probes on a function: `provider:fn_name` fires at entry with the function's
/// arguments, and `provider:fn_name__return` fires when it returns, with the return value when
/// its type is a supported scalar (integers, `bool`, `char`, floats, raw pointers, references,
/// `&str`, `&[u8]`), without arguments otherwise.
///
/// `provider` defaults to the crate's name; `#[probe(provider = "p", name = "n")]` overrides
/// either. Every parameter must be a plain identifier (or `self`) whose type implements
/// `selftrace::usdt::ProbeArg`; `self` and references are passed by address.
///
/// `async fn`: the entry probe fires when the future is first polled (an `async fn` runs
/// nothing before), the return probe when it completes. `const fn` is rejected.
#[proc_macro_attribute]
pub fn probe(attr: TokenStream, item: TokenStream) -> TokenStream {
    match attr::expand(attr.into(), item.into()) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}
