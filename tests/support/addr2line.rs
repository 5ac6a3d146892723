//! binutils' `addr2line` or elfutils' `eu-addr2line` as the oracle of file:line: runs it and
//! parses its output.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// One function at an address, as `addr2line -f -C -i` gives it: (function, file, line);
/// `line` is `None` where binutils printed `??:0` or no line.
pub type Their = (String, String, Option<u32>);

/// Parses `addr2line -a -f -C -i` output (binutils': `file:line`, elfutils': `file:line:col`
/// and `name inlined at file:line:col in caller`): per address, its functions innermost first.
pub fn parse(out: &str) -> Vec<Vec<Their>> {
    let mut groups: Vec<Vec<Their>> = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("0x") {
            groups.push(Vec::new());
            continue;
        }
        let func = l.split(" inlined at ").next().unwrap().to_string();
        let loc = lines.next().unwrap_or("??:0");
        let loc = loc.split(" (discriminator").next().unwrap();
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let (file, line) = match loc.rsplitn(3, ':').collect::<Vec<_>>()[..] {
            [col, line, file] if numeric(col) && numeric(line) => (file, line),
            _ => loc.rsplit_once(':').unwrap_or((loc, "0")),
        };
        let line = line.parse::<u32>().ok().filter(|&l| l != 0);
        groups
            .last_mut()
            .expect("address line first")
            .push((func, file.to_string(), line));
    }
    groups
}

/// Runs `tool -a -f -C -i -e file` (tool: `addr2line`, the cross binutils' one, or
/// `eu-addr2line`) on the
/// link-time addresses `svmas` of `file`, and parses the answer (one group per address).
pub fn run(tool: &str, file: &Path, svmas: &[u64]) -> Vec<Vec<Their>> {
    let out = Command::new(tool)
        .args(["-a", "-f", "-C", "-i", "-e"])
        .arg(file)
        .args(svmas.iter().map(|a| format!("{a:#x}")))
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(out.status.success(), "{tool} failed on {file:?}");
    let groups = parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(groups.len(), svmas.len(), "{tool} answered every address");
    groups
}

/// Whether our file name and binutils' name the same file (binutils may print the path as the
/// unit gives it, relative or absolute; compare the last component).
pub fn same_file(ours: &str, theirs: &str) -> bool {
    ours.rsplit('/').next() == theirs.rsplit('/').next()
}
