//! `#[probe]` on a function: an entry probe with the arguments and a `__return` probe.

use crate::site;
use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::spanned::Spanned;
use syn::{parse_quote, Expr, FnArg, ItemFn, LitStr, Pat, ReturnType, Type};

/// Return types whose value the `__return` probe carries.
const SCALARS: &[&str] = &[
    "i8", "i16", "i32", "i64", "isize", "u8", "u16", "u32", "u64", "usize", "bool", "char", "f32",
    "f64",
];

fn supported_return(ty: &Type) -> bool {
    match ty {
        Type::Ptr(_) | Type::Reference(_) => true,
        Type::Paren(p) => supported_return(&p.elem),
        Type::Path(p) => {
            p.qself.is_none()
                && p.path.segments.len() == 1
                && p.path.segments[0].arguments.is_empty()
                && SCALARS.contains(&p.path.segments[0].ident.to_string().as_str())
        }
        _ => false,
    }
}

fn contains_impl(ty: &Type) -> bool {
    ty.to_token_stream()
        .into_iter()
        .any(|t| matches!(t, proc_macro2::TokenTree::Ident(ref i) if i == "impl"))
}

pub fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let mut provider: Option<LitStr> = None;
    let mut name: Option<LitStr> = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("provider") {
            provider = Some(meta.value()?.parse()?);
            Ok(())
        } else if meta.path.is_ident("name") {
            name = Some(meta.value()?.parse()?);
            Ok(())
        } else {
            Err(meta.error("expected `provider = \"...\"` or `name = \"...\"`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;

    let mut func: ItemFn = syn::parse2(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            "#[probe] goes on a function (free function, method or associated function)",
        )
    })?;
    let sig = &func.sig;
    if let Some(c) = &sig.constness {
        return Err(syn::Error::new(
            c.span(),
            "#[probe] cannot go on a `const fn`: a probe is not allowed in constant evaluation",
        ));
    }

    let (provider, provider_span) = match &provider {
        Some(p) => (p.value(), p.span()),
        None => (
            std::env::var("CARGO_CRATE_NAME").unwrap_or_else(|_| "rust".to_string()),
            Span::call_site(),
        ),
    };
    site::check_name(&provider, provider_span, "provider")?;
    let (name, name_span) = match &name {
        Some(n) => (n.value(), n.span()),
        None => (
            sig.ident.to_string().trim_start_matches("r#").to_string(),
            sig.ident.span(),
        ),
    };
    site::check_name(&name, name_span, "name")?;
    let ret_name = format!("{name}__return");
    site::check_name(&ret_name, name_span, "name")?;

    let mut args: Vec<Expr> = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(r) => {
                if r.reference.is_some() {
                    args.push(parse_quote!(self));
                } else {
                    args.push(parse_quote!(&self));
                }
            }
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(id) if id.subpat.is_none() => {
                    let ident = &id.ident;
                    args.push(parse_quote!(#ident));
                }
                other => {
                    return Err(syn::Error::new(
                        other.span(),
                        "#[probe] needs parameters that are plain identifiers (the probe passes them by name)",
                    ))
                }
            },
        }
    }
    if args.len() > site::MAX_ARGS {
        return Err(syn::Error::new(
            sig.inputs
                .iter()
                .nth(site::MAX_ARGS)
                .map_or(sig.span(), |a| a.span()),
            format!(
                "a USDT probe has at most {} arguments, this function has {}",
                site::MAX_ARGS,
                args.len()
            ),
        ));
    }

    let krate = quote!(::selftrace);
    let entry = site::generate(&krate, &provider, &name, &args, site::Mode::Eager);
    let ret_ident: Expr = parse_quote!(__selftrace_ret);
    let (ret_ty, ret_args) = match &sig.output {
        ReturnType::Default => (None, vec![]),
        ReturnType::Type(_, ty) => {
            let carried = if supported_return(ty) {
                vec![ret_ident.clone()]
            } else {
                vec![]
            };
            (Some(ty.clone()), carried)
        }
    };
    let ret = site::generate(&krate, &provider, &ret_name, &ret_args, site::Mode::Eager);
    let block = &func.block;
    let annotated = ret_ty.as_ref().filter(|t| !contains_impl(t));
    let (let_ty, closure_ty) = match annotated {
        Some(t) => (quote!(: #t), quote!(-> #t)),
        None => (quote!(), quote!()),
    };
    let new_block: syn::Block = if sig.asyncness.is_some() {
        parse_quote!({
            #entry
            let __selftrace_ret #let_ty = async move #block.await;
            #ret
            __selftrace_ret
        })
    } else {
        parse_quote!({
            #entry
            // Called through an `FnOnce` bound so that the body may return borrows of the
            // arguments (`&mut self` -> `&mut T`), which an `FnMut` closure could not.
            let __selftrace_ret #let_ty = ::selftrace::usdt::__private::call_once(move || #closure_ty #block);
            #ret
            __selftrace_ret
        })
    };
    *func.block = new_block;
    Ok(func.into_token_stream())
}
