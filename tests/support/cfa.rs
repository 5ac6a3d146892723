//! The CFA rule at a pc, as binutils' `readelf --debug-dump=frames-interp OBJ` prints it
//! (`rsp+8`, `rax+8`, `r11+40976`, `exp`, ...): an independent view of what an unwinder must
//! evaluate there, used to pick breakpoints and to show that samples hit the hard cases.

use std::path::Path;

/// One FDE: its pc range and its rows (location, CFA column) in order.
struct Fde {
    start: u64,
    end: u64,
    rows: Vec<(u64, String)>,
}

/// The FDEs of one object's `.eh_frame`, sorted by start (link-time addresses).
pub struct CfaTable {
    fdes: Vec<Fde>,
}

impl CfaTable {
    /// Runs readelf on `path`; `Err` says why not (readelf missing or failing).
    pub fn load(path: &Path) -> Result<CfaTable, String> {
        let out = std::process::Command::new("readelf")
            .arg("--debug-dump=frames-interp")
            .arg(path)
            .output()
            .map_err(|e| format!("readelf: {e} (install binutils)"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // readelf 2.40 exits with 1 on ld.so although it printed the whole table: judge by
        // the output.
        if !text.contains("Contents of the .eh_frame") {
            return Err(format!("readelf failed on {}", path.display()));
        }
        Ok(Self::parse(&text))
    }

    fn parse(text: &str) -> CfaTable {
        let mut fdes = Vec::new();
        let mut cur: Option<Fde> = None;
        for line in text.lines() {
            if line.contains(" FDE ") {
                if let Some(f) = cur.take() {
                    fdes.push(f);
                }
                let range = line.split("pc=").nth(1).and_then(|r| {
                    let (a, b) = r.trim().split_once("..")?;
                    Some((
                        u64::from_str_radix(a, 16).ok()?,
                        u64::from_str_radix(b, 16).ok()?,
                    ))
                });
                if let Some((start, end)) = range {
                    cur = Some(Fde {
                        start,
                        end,
                        rows: Vec::new(),
                    });
                }
                continue;
            }
            if line.contains(" CIE") {
                if let Some(f) = cur.take() {
                    fdes.push(f);
                }
                continue;
            }
            let Some(f) = cur.as_mut() else { continue };
            let mut w = line.split_whitespace();
            let (Some(loc), Some(cfa)) = (w.next(), w.next()) else {
                continue;
            };
            if let Ok(loc) = u64::from_str_radix(loc, 16) {
                f.rows.push((loc, cfa.to_string()));
            }
        }
        if let Some(f) = cur.take() {
            fdes.push(f);
        }
        fdes.sort_by_key(|f| f.start);
        CfaTable { fdes }
    }

    /// The CFA rule at link-time address `svma`: `None` without an FDE there; an FDE without
    /// rows keeps the CIE's initial rule (`rsp+8` on x86-64).
    pub fn rule_at(&self, svma: u64) -> Option<&str> {
        let i = self
            .fdes
            .partition_point(|f| f.start <= svma)
            .checked_sub(1)?;
        let f = &self.fdes[i];
        if svma >= f.end {
            return None;
        }
        let r = f.rows.partition_point(|r| r.0 <= svma);
        Some(r.checked_sub(1).map_or("rsp+8", |r| f.rows[r].1.as_str()))
    }

    /// Link-time addresses, inside `[start, end)`, where a row's CFA rule satisfies `want`:
    /// (row start, row end).
    pub fn rows_where(&self, start: u64, end: u64, want: impl Fn(&str) -> bool) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for f in self.fdes.iter().filter(|f| f.start < end && f.end > start) {
            for (k, (loc, cfa)) in f.rows.iter().enumerate() {
                let row_end = f.rows.get(k + 1).map_or(f.end, |r| r.0);
                if want(cfa) && *loc >= start && *loc < end && row_end > *loc {
                    out.push((*loc, row_end));
                }
            }
        }
        out
    }
}

/// True for a CFA rule that needs more than rsp/rbp + offset: an expression or another register.
pub fn is_hard(rule: &str) -> bool {
    !(rule.starts_with("rsp+") || rule.starts_with("rbp+"))
}
