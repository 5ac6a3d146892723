//! A suspended future's chain of `.await`s, read from its memory with the layouts rustc
//! describes in the program's DWARF.
//!
//! An `async fn`'s future is a structure (`{async_fn_env#0}` in the function's namespace, an
//! async block's `{async_block_env#N}`) with a variant part over its `__state` member: one
//! variant per suspend point (`Suspend0`, ...), whose member carries the line of its `.await`,
//! and whose `__awaitee` member is the future it awaits, stored inline. From a task's root
//! future (its address and the address of its `poll`, whose first parameter is
//! `Pin<&mut F>`) the chain is read by following `__awaitee` through each active variant, into
//! the branches of `join!`/`select!` (the tuple `futures` beside their `PollFn`, each branch a
//! `MaybeDone` or a future), down to the leaf future (tokio's `Sleep`, a channel's `recv`).
//!
//! Needs the type information of full debuginfo (`debug = 2`, the dev profile's default) for
//! the crates whose futures are read: with `debug = "limited"` or `"line-tables-only"` the
//! functions are there but not the types, and the chain is refused with that reason.
//!
//! Normal context: parses DWARF, allocates; reads the future's memory with checked reads
//! (a task freed meanwhile reads as unreadable, never faults).

use crate::symbolize::lines::with_unit_at;
use addr2line::gimli;
use gimli::constants as dw;
use std::collections::HashMap;

type Reader = gimli::EndianSlice<'static, gimli::RunTimeEndian>;
type UnitRef<'a> = gimli::UnitRef<'a, Reader>;
type Offset = gimli::UnitOffset<usize>;

/// One future of a chain, outermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Awaiting {
    /// How deep in the chain (0: the task's own future); branches of a `join!`/`select!` are
    /// one deeper than the future that awaits them.
    pub(crate) depth: usize,
    /// The future's type: an async fn's path (`svc::handle`), an async block's
    /// (`svc::main::{async_block#0}`), or the type's name (`tokio::time::sleep::Sleep`).
    pub(crate) name: String,
    /// The variant it is in: `Suspend0`, `Unresumed`, a `MaybeDone`'s `Done`; empty for a
    /// plain struct.
    pub(crate) state: String,
    /// The file and line of the `.await` it is suspended at (an async fn or block).
    pub(crate) at: Option<(String, u64)>,
    /// Where the async fn or block itself is, when its `.await` is in another file: an
    /// `.await` inside a macro (`join!`, `select!`), whose line is the macro's.
    pub(crate) in_fn_at: Option<(String, u64)>,
}

/// Why a chain could not be read.
pub(crate) type Why = &'static str;

/// The futures a task waits in, from its root future at `addr` whose `poll` is the function at
/// runtime address `poll`. At most `max` entries (a longer chain ends with `…`).
pub(crate) fn await_chain(poll: usize, addr: usize, max: usize) -> Result<Vec<Awaiting>, Why> {
    let r = with_unit_at(poll, |unit, svma| {
        let key = (unit.dwarf as *const _ as usize, unit.header.offset());
        let mut caches = CACHES.lock_or_reset(|| None);
        let cache = caches
            .get_or_insert_with(HashMap::new)
            .entry(key)
            .or_default();
        let ty = match cache.roots.get(&svma) {
            Some(&ty) => ty,
            None => {
                let ty = root_type(&unit, svma)?;
                cache.roots.insert(svma, ty);
                ty
            }
        };
        let mut out = Vec::new();
        describe(&unit, cache, ty, addr, 0, max, &mut out);
        Ok(out)
    });
    match r {
        Ok(r) => r,
        Err(_) => Err("no DWARF for the task's code (built without debug info, or stripped)"),
    }
}

/// What one unit's DWARF said, kept for the next dumps: the root future types by `poll`
/// address, the types' qualified names, the DIEs' children.
#[derive(Default)]
struct UnitCache {
    roots: HashMap<u64, Offset>,
    names: HashMap<usize, String>,
    children: HashMap<usize, Vec<(gimli::DwTag, Offset)>>,
}

/// By unit: (its `Dwarf`, never freed, and the unit's offset in it).
type Caches = HashMap<(usize, gimli::UnitSectionOffset<usize>), UnitCache>;
static CACHES: crate::fork::ForkMutex<Option<Caches>> = crate::fork::ForkMutex::new(None);

/// The type `F` of the future whose `poll` starts at link-time address `svma`: the first
/// parameter of that function is `Pin<&mut F>`.
fn root_type(unit: &UnitRef<'_>, svma: u64) -> Result<Offset, Why> {
    let mut cursor = unit.entries();
    let mut in_fn: Option<isize> = None;
    let mut found_fn = false;
    while let Ok(Some(e)) = cursor.next_dfs() {
        if let Some(d) = in_fn {
            if e.depth() <= d {
                break;
            }
            if e.depth() == d + 1 && e.tag() == dw::DW_TAG_formal_parameter {
                let ty = type_of(e).ok_or(NO_TYPES)?;
                return pointee_of_pin(unit, ty);
            }
            continue;
        }
        if e.tag() == dw::DW_TAG_subprogram {
            let low = e
                .attr_value(dw::DW_AT_low_pc)
                .and_then(|v| unit.attr_address(v).ok().flatten());
            if low == Some(svma) {
                in_fn = Some(e.depth());
                found_fn = true;
            }
        }
    }
    Err(if found_fn {
        NO_TYPES
    } else {
        "the task's poll function is not in its unit's DWARF"
    })
}

/// What a unit without type information makes us say.
const NO_TYPES: Why = "no type information for the task's future (its crate was built with \
                       debug = \"limited\" or \"line-tables-only\"; the chain needs debug = 2)";

/// `Pin<&mut F>` (or `&mut F`) → `F`.
fn pointee_of_pin(unit: &UnitRef<'_>, ty: Offset) -> Result<Offset, Why> {
    let e = unit.entry(ty).map_err(|_| BAD)?;
    if e.tag() == dw::DW_TAG_pointer_type || e.tag() == dw::DW_TAG_reference_type {
        return type_of(&e).ok_or(BAD);
    }
    // Pin's one member, `pointer`: a `&mut F`.
    let member = children(unit, ty)
        .into_iter()
        .find(|(tag, _)| *tag == dw::DW_TAG_member)
        .ok_or(BAD)?;
    let m = unit.entry(member.1).map_err(|_| BAD)?;
    let ptr = type_of(&m).ok_or(BAD)?;
    let p = unit.entry(ptr).map_err(|_| BAD)?;
    type_of(&p).ok_or(BAD)
}

const BAD: Why = "the task's poll function has an unexpected DWARF shape";

/// A DIE's `DW_AT_type`, within its unit.
fn type_of(e: &gimli::DebuggingInformationEntry<Reader>) -> Option<Offset> {
    match e.attr_value(dw::DW_AT_type)? {
        gimli::AttributeValue::UnitRef(o) => Some(o),
        _ => None,
    }
}

/// The direct children of the DIE at `off`: (tag, offset), cached.
fn kids(unit: &UnitRef<'_>, cache: &mut UnitCache, off: Offset) -> Vec<(gimli::DwTag, Offset)> {
    cache
        .children
        .entry(off.0)
        .or_insert_with(|| children(unit, off))
        .clone()
}

/// The direct children of the DIE at `off`: (tag, offset).
fn children(unit: &UnitRef<'_>, off: Offset) -> Vec<(gimli::DwTag, Offset)> {
    let mut out = Vec::new();
    let Ok(mut tree) = unit.entries_tree(Some(off)) else {
        return out;
    };
    let Ok(root) = tree.root() else { return out };
    let mut kids = root.children();
    while let Ok(Some(child)) = kids.next() {
        out.push((child.entry().tag(), child.entry().offset()));
    }
    out
}

fn name_of(unit: &UnitRef<'_>, e: &gimli::DebuggingInformationEntry<Reader>) -> Option<String> {
    let v = e.attr_value(dw::DW_AT_name)?;
    let s = unit.attr_string(v).ok()?;
    Some(String::from_utf8_lossy(s.slice()).into_owned())
}

fn member_offset(e: &gimli::DebuggingInformationEntry<Reader>) -> usize {
    e.attr_value(dw::DW_AT_data_member_location)
        .and_then(|v| v.udata_value())
        .unwrap_or(0) as usize
}

fn byte_size(unit: &UnitRef<'_>, ty: Offset) -> usize {
    unit.entry(ty)
        .ok()
        .and_then(|e| e.attr_value(dw::DW_AT_byte_size))
        .and_then(|v| v.udata_value())
        .unwrap_or(0) as usize
}

/// The qualified names of the unit's types, by offset (namespaces and enclosing types joined
/// with `::`), built once per unit and call.
fn qualified_name(unit: &UnitRef<'_>, cache: &mut UnitCache, off: Offset) -> Option<String> {
    let names = &mut cache.names;
    if names.is_empty() {
        let mut path: Vec<(isize, String)> = Vec::new();
        let mut cursor = unit.entries();
        while let Ok(Some(e)) = cursor.next_dfs() {
            let d = e.depth();
            while path.last().is_some_and(|(pd, _)| *pd >= d) {
                path.pop();
            }
            let scoped = matches!(
                e.tag(),
                dw::DW_TAG_namespace
                    | dw::DW_TAG_structure_type
                    | dw::DW_TAG_enumeration_type
                    | dw::DW_TAG_union_type
            );
            if !scoped {
                continue;
            }
            let Some(n) = name_of(unit, e) else { continue };
            let full = match path.last() {
                Some((_, p)) => format!("{p}::{n}"),
                None => n,
            };
            if e.tag() != dw::DW_TAG_namespace {
                names.insert(e.offset().0, full.clone());
            }
            if e.has_children() {
                path.push((d, full));
            }
        }
        // Marks the map as built, also for a unit without named types.
        names.insert(usize::MAX, String::new());
    }
    names.get(&off.0).cloned()
}

/// An async fn's path for its future's type name: `svc::handle::{async_fn_env#0}` →
/// `svc::handle`; an async block's `…::{async_block_env#0}` → `…`; others as they are.
fn display_name(name: &str) -> String {
    for suffix in ["::{async_fn_env#", "::{async_block_env#"] {
        if let Some(i) = name.rfind(suffix) {
            // Only the type's own last segment (`{async_fn_env#0}` and its generic
            // arguments), not a future named inside another type's arguments.
            // (Not a future named inside another type's generic arguments: `MaybeDone<…>`.)
            let before = &name[..i];
            if before.matches('<').count() == before.matches('>').count() {
                return before.to_string();
            }
        }
    }
    name.to_string()
}

/// The file of `DW_AT_decl_file` index `file` in the unit's line table.
fn file_name(unit: &UnitRef<'_>, file: u64) -> Option<String> {
    let header = unit.line_program.as_ref()?.header();
    let f = header.file(file)?;
    let name = unit.attr_string(f.path_name()).ok()?;
    let name = String::from_utf8_lossy(name.slice()).into_owned();
    if name.starts_with('/') {
        return Some(name);
    }
    let dir = f
        .directory(header)
        .and_then(|d| unit.attr_string(d).ok())
        .map(|d| String::from_utf8_lossy(d.slice()).into_owned())
        .unwrap_or_default();
    Some(if dir.is_empty() {
        name
    } else {
        format!("{dir}/{name}")
    })
}

/// Reads `size` (1 to 8) bytes at `addr` as an integer; `None` when the memory is not
/// readable.
fn read_uint(addr: usize, size: usize) -> Option<u64> {
    let mut b = [0u8; 8];
    let size = size.clamp(1, 8);
    if crate::sys::read_memory(addr, &mut b[..size]) != size {
        return None;
    }
    // This process's own memory: its own byte order.
    Some(if cfg!(target_endian = "little") {
        u64::from_le_bytes(b)
    } else {
        u64::from_be_bytes(b) >> (8 * (8 - size))
    })
}

/// A DIE's `DW_AT_decl_file` and `DW_AT_decl_line`.
fn decl(unit: &UnitRef<'_>, e: &gimli::DebuggingInformationEntry<Reader>) -> Option<(String, u64)> {
    let file = match e.attr_value(dw::DW_AT_decl_file)? {
        gimli::AttributeValue::FileIndex(f) => file_name(unit, f),
        v => v.udata_value().and_then(|f| file_name(unit, f)),
    }?;
    let line = e.attr_value(dw::DW_AT_decl_line)?.udata_value()?;
    Some((file, line))
}

/// Whether the type at `ty` is an async fn's or block's future (a variant part over
/// `__state`).
fn is_coroutine(unit: &UnitRef<'_>, cache: &mut UnitCache, ty: Offset) -> bool {
    kids(unit, cache, ty)
        .into_iter()
        .filter(|(t, _)| *t == dw::DW_TAG_variant_part)
        .any(|(_, p)| {
            let discr = unit
                .entry(p)
                .ok()
                .and_then(|e| match e.attr_value(dw::DW_AT_discr) {
                    Some(gimli::AttributeValue::UnitRef(o)) => unit.entry(o).ok(),
                    _ => None,
                });
            discr.is_some_and(|d| name_of(unit, &d).as_deref() == Some("__state"))
        })
}

/// Appends the future of type `ty` at `addr` and what it awaits.
fn describe(
    unit: &UnitRef<'_>,
    cache: &mut UnitCache,
    ty: Offset,
    addr: usize,
    depth: usize,
    max: usize,
    out: &mut Vec<Awaiting>,
) {
    if out.len() >= max {
        if out.last().is_none_or(|a| a.name != "…") {
            out.push(Awaiting {
                depth,
                name: "…".into(),
                state: String::new(),
                at: None,
                in_fn_at: None,
            });
        }
        return;
    }
    let Ok(e) = unit.entry(ty) else { return };
    let raw = qualified_name(unit, cache, ty)
        .or_else(|| name_of(unit, &e))
        .unwrap_or_else(|| "?".into());
    let name = display_name(&raw);
    let own_kids = kids(unit, cache, ty);
    let Some(&(_, part)) = own_kids.iter().find(|(t, _)| *t == dw::DW_TAG_variant_part) else {
        // A plain struct: a leaf, except the wrappers that hold the future they run.
        out.push(Awaiting {
            depth,
            name,
            state: String::new(),
            at: None,
            in_fn_at: None,
        });
        for (tag, m) in own_kids {
            if tag != dw::DW_TAG_member {
                continue;
            }
            let Ok(me) = unit.entry(m) else { continue };
            let mname = name_of(unit, &me).unwrap_or_default();
            // A wrapper's future (tracing's Instrumented `inner`, selftrace's Watched
            // `future`), when it is an async fn's or block's.
            if mname == "inner" || mname == "future" {
                if let Some(t) = type_of(&me).filter(|&t| is_coroutine(unit, cache, t)) {
                    describe(
                        unit,
                        cache,
                        t,
                        addr + member_offset(&me),
                        depth + 1,
                        max,
                        out,
                    );
                }
                break;
            }
        }
        return;
    };
    // The discriminant: `__state` for a coroutine, unnamed for an enum (MaybeDone).
    let Ok(pe) = unit.entry(part) else { return };
    let discr = match pe.attr_value(dw::DW_AT_discr) {
        Some(gimli::AttributeValue::UnitRef(o)) => unit.entry(o).ok(),
        _ => None,
    };
    let (coroutine, value) = match &discr {
        Some(d) => {
            let size = type_of(d).map_or(1, |t| byte_size(unit, t));
            let coroutine = name_of(unit, d).as_deref() == Some("__state");
            (coroutine, read_uint(addr + member_offset(d), size))
        }
        None => (false, None),
    };
    let Some(value) = value else {
        out.push(Awaiting {
            depth,
            name,
            state: "(unreadable)".into(),
            at: None,
            in_fn_at: None,
        });
        return;
    };
    // The variant whose discriminant value it is (or the default one, without a value).
    let mut chosen = None;
    for (tag, v) in kids(unit, cache, part) {
        if tag != dw::DW_TAG_variant {
            continue;
        }
        let Ok(ve) = unit.entry(v) else { continue };
        match ve.attr_value(dw::DW_AT_discr_value) {
            Some(dv) if dv.udata_value() == Some(value) => {
                chosen = Some(v);
                break;
            }
            Some(_) => {}
            None => {
                chosen = chosen.or(Some(v));
            }
        }
    }
    // The variant's member: its type is the variant's struct (`Suspend0`), its line the
    // `.await`'s.
    let member = chosen.and_then(|v| {
        kids(unit, cache, v)
            .into_iter()
            .find(|(t, _)| *t == dw::DW_TAG_member)
            .and_then(|(_, m)| unit.entry(m).ok())
    });
    let Some(member) = member else {
        out.push(Awaiting {
            depth,
            name,
            state: format!("(state {value} not in its DWARF)"),
            at: None,
            in_fn_at: None,
        });
        return;
    };
    let vty = type_of(&member);
    let state = vty
        .and_then(|t| unit.entry(t).ok())
        .and_then(|t| name_of(unit, &t))
        .unwrap_or_default();
    let (at, in_fn_at) = if coroutine && state.starts_with("Suspend") {
        let at = decl(unit, &member);
        // The `Unresumed` variant's (value 0) line is the async fn's or block's own.
        let own = kids(unit, cache, part)
            .into_iter()
            .filter(|(t, _)| *t == dw::DW_TAG_variant)
            .filter_map(|(_, v)| unit.entry(v).ok().map(|e| (v, e)))
            .find(|(_, e)| {
                e.attr_value(dw::DW_AT_discr_value)
                    .and_then(|d| d.udata_value())
                    == Some(0)
            })
            .and_then(|(v, _)| {
                kids(unit, cache, v)
                    .into_iter()
                    .find(|(t, _)| *t == dw::DW_TAG_member)
                    .and_then(|(_, m)| unit.entry(m).ok())
            })
            .and_then(|m| decl(unit, &m));
        let elsewhere = match (&at, &own) {
            (Some((f, _)), Some((g, _))) => f != g,
            _ => false,
        };
        (at, own.filter(|_| elsewhere))
    } else {
        (None, None)
    };
    out.push(Awaiting {
        depth,
        name,
        state,
        at,
        in_fn_at,
    });
    let Some(vty) = vty else { return };
    // What the variant holds: the awaited future (a coroutine's `__awaitee`, an enum's
    // `future`), and a `join!`/`select!`'s branches (`futures`, beside their `PollFn`).
    let mut next: Vec<(String, Offset, usize)> = Vec::new();
    for (tag, m) in kids(unit, cache, vty) {
        if tag != dw::DW_TAG_member {
            continue;
        }
        let Ok(me) = unit.entry(m) else { continue };
        let mname = name_of(unit, &me).unwrap_or_default();
        let Some(t) = type_of(&me) else { continue };
        if mname == "__awaitee" || (!coroutine && mname == "future") || mname == "futures" {
            next.push((mname, t, member_offset(&me)));
        }
    }
    let joins = next.iter().any(|(n, _, _)| n == "futures");
    for (mname, t, off) in next {
        let at = addr + off;
        if mname == "futures" {
            // A tuple of the branches: each one deeper.
            for (tag, m) in kids(unit, cache, t) {
                if tag != dw::DW_TAG_member {
                    continue;
                }
                let Ok(me) = unit.entry(m) else { continue };
                if let Some(bt) = type_of(&me) {
                    describe(
                        unit,
                        cache,
                        bt,
                        at + member_offset(&me),
                        depth + 1,
                        max,
                        out,
                    );
                }
            }
        } else if joins && mname == "__awaitee" {
            // The `PollFn` that polls the branches: its closure points back at them.
            continue;
        } else {
            describe(unit, cache, t, at, depth + 1, max, out);
        }
    }
}
