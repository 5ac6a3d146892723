//! An independent symbol oracle for tests: the main program's `.symtab`, read from
//! `/proc/self/exe` with the `object` crate, so that tests check selftrace's stacks against
//! names that selftrace did not produce.

use object::{Object, ObjectSymbol, SymbolKind};

/// Function symbols of the main program, sorted by run-time address.
pub struct Oracle {
    syms: Vec<(usize, usize, String)>,
}

impl Oracle {
    /// Reads the main program's symbol table.
    pub fn load() -> Oracle {
        let data = std::fs::read("/proc/self/exe").expect("read /proc/self/exe");
        let file = object::File::parse(&*data).expect("parse /proc/self/exe");
        let bias = selftrace::modules::snapshot()
            .objects()
            .iter()
            .find(|o| o.is_main)
            .expect("main program")
            .bias;
        let mut syms: Vec<(usize, usize, String)> = file
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
            .filter_map(|s| {
                let name = s.name().ok()?;
                let name = format!("{:#}", rustc_demangle::demangle(name));
                Some((s.address() as usize + bias, s.size() as usize, name))
            })
            .collect();
        syms.sort();
        Oracle { syms }
    }

    /// The demangled name of the function containing `addr` (without hash).
    pub fn name(&self, addr: usize) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (start, size, name) = &self.syms[i];
        (addr < start + (*size).max(1)).then_some(name.as_str())
    }

    /// Names of `frames`: frame 0 looked up as is when `exact_first`, later frames (return
    /// addresses) at address - 1.
    pub fn names(&self, frames: &[usize], exact_first: bool) -> Vec<String> {
        frames
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let a = if i == 0 && exact_first {
                    a
                } else {
                    a.saturating_sub(1)
                };
                self.name(a).unwrap_or("?").to_string()
            })
            .collect()
    }
}

/// The last path segment of a demangled name: `crate::module::f` -> `f`.
pub fn leaf(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}
