//! Unit tests of the crate's structure: the import arrows of src/ (issue 46): no circle between the crate's top-level modules nor
//! between sibling files of one module, and the named floors in order, each importing only
//! floors below it. Read from the source text (`crate::…` and `super::…` paths outside unit
//! tests), so that a new arrow up fails here with the file that drew it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors the issue names, lowest first: a module may import modules on its floor or below.
const FLOORS: &[&[&str]] = &[
    &["sys", "context", "error", "fmt", "fork", "published"],
    &["modules"],
    &["unwind"],
    &["symbolize"],
    &["setup"],
    &["procfs"],
    &["report"],
    &["threads"],
    &["minidump"],
    &["crash"],
    &["watchdog", "profile", "tasks"],
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().unwrap() != "bin" {
                rs_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` -> ["a", "b"]; `src/lib.rs` -> [].
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut v: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if v.last().is_some_and(|s| s == "mod" || s == "lib") {
        v.pop();
    }
    v
}

fn without_comments_and_tests(text: &str) -> String {
    let body = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path that starts with `crate::` or `super::` (grouped `use a::{b, c::d}` included).
fn paths(text: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !(ident(b[i - 1]) || b[i - 1] == b'$');
        let kind = if at_word && b[i..].starts_with(b"crate::") {
            Some((true, 7))
        } else if at_word && b[i..].starts_with(b"super::") {
            Some((false, 7))
        } else {
            None
        };
        let Some((is_crate, skip)) = kind else {
            i += 1;
            continue;
        };
        let mut j = i + skip;
        let mut segs = Vec::new();
        loop {
            let s = j;
            while j < b.len() && ident(b[j]) {
                j += 1;
            }
            if j == s {
                break;
            }
            segs.push(text[s..j].to_string());
            if b[j..].starts_with(b"::") {
                j += 2;
                if b.get(j) == Some(&b'{') {
                    let end = b[j..]
                        .iter()
                        .position(|&c| c == b'}')
                        .map_or(b.len(), |e| j + e);
                    for part in text[j + 1..end].split(',') {
                        let p: Vec<String> = part
                            .trim()
                            .split("::")
                            .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
                            .filter(|s| !s.is_empty() && s != "self" && !s.starts_with('{'))
                            .collect();
                        let mut full = segs.clone();
                        full.extend(p);
                        out.push((is_crate, full));
                    }
                    j = end;
                    segs.clear();
                    break;
                }
            } else {
                break;
            }
        }
        // A macro (`crate::probe!`) has no other path: not an import.
        if !segs.is_empty() && b.get(j) != Some(&b'!') {
            out.push((is_crate, segs));
        }
        i = j.max(i + 1);
    }
    out
}

struct Graph {
    /// (from module, to module) -> one file that draws the arrow.
    edges: BTreeMap<(Vec<String>, Vec<String>), String>,
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
    let resolve = |mut segs: Vec<String>| {
        while !segs.is_empty() && !modules.contains(&segs) {
            segs.pop();
        }
        segs
    };
    let mut edges = BTreeMap::new();
    for f in &files {
        let m = module_of(&src, f);
        let is_dir_module = f.ends_with("mod.rs") || f.ends_with("lib.rs");
        let text = without_comments_and_tests(&std::fs::read_to_string(f).unwrap());
        for (is_crate, mut segs) in paths(&text) {
            let mut base = Vec::new();
            if !is_crate {
                base = m.clone();
                if !is_dir_module {
                    base.pop();
                }
                base.pop();
                while segs.first().is_some_and(|s| s == "super") {
                    segs.remove(0);
                    base.pop();
                }
            }
            base.extend(segs);
            let to = resolve(base);
            if to != m {
                let name = f.strip_prefix(&src).unwrap().display().to_string();
                edges.entry((m.clone(), to)).or_insert(name);
            }
        }
    }
    Graph { edges }
}

/// Strongly connected components with more than one node (Tarjan).
fn circles(adj: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        adj: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        out: Vec<Vec<String>>,
    }
    fn visit(t: &mut T, n: &str) {
        let i = t.index.len();
        t.index.insert(n.to_string(), i);
        t.low.insert(n.to_string(), i);
        t.stack.push(n.to_string());
        for w in t.adj.get(n).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[n]);
                t.low.insert(n.to_string(), l);
            } else if t.stack.contains(w) {
                let l = t.index[w].min(t.low[n]);
                t.low.insert(n.to_string(), l);
            }
        }
        if t.low[n] == t.index[n] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                let done = w == n;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<String> = adj
        .keys()
        .cloned()
        .chain(adj.values().flatten().cloned())
        .collect();
    for n in &nodes {
        if !t.index.contains_key(n) {
            visit(&mut t, n);
        }
    }
    t.out
}

fn describe(g: &Graph, comp: &[String], key: impl Fn(&[String]) -> Option<String>) -> String {
    let mut s = comp.join(" <-> ");
    for ((a, b), file) in &g.edges {
        if let (Some(ka), Some(kb)) = (key(a), key(b)) {
            if ka != kb && comp.contains(&ka) && comp.contains(&kb) {
                s += &format!("\n    {ka} -> {kb} (in src/{file})");
            }
        }
    }
    s
}

#[test]
fn no_import_circle_between_modules_or_between_sibling_files() {
    let g = graph();
    let room = |m: &[String]| Some(m.first().cloned().unwrap_or_else(|| "lib".into()));
    let mut rooms: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in g.edges.keys() {
        let (ra, rb) = (room(a).unwrap(), room(b).unwrap());
        if ra != rb && ra != "lib" {
            rooms.entry(ra).or_default().insert(rb);
        }
        if a.len() > 1 && a.len() == b.len() && a[..a.len() - 1] == b[..b.len() - 1] {
            files.entry(a.join("/")).or_default().insert(b.join("/"));
        }
    }
    let mut found = Vec::new();
    for c in circles(&rooms) {
        found.push(describe(&g, &c, room));
    }
    for c in circles(&files) {
        found.push(describe(&g, &c, |m: &[String]| Some(m.join("/"))));
    }
    assert!(
        found.is_empty(),
        "import circles in src/:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_arrow_between_the_named_floors_points_down() {
    let g = graph();
    let floor = |m: &[String]| {
        let r = m.first()?;
        FLOORS.iter().position(|f| f.contains(&r.as_str()))
    };
    let mut up = Vec::new();
    for ((a, b), file) in &g.edges {
        if let (Some(fa), Some(fb)) = (floor(a), floor(b)) {
            if fb > fa {
                up.push(format!("{} -> {} (src/{file})", a.join("::"), b.join("::")));
            }
        }
    }
    assert!(up.is_empty(), "arrows pointing up:\n{}", up.join("\n"));
}

#[test]
fn internal_code_does_not_import_through_the_crate_root() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut bad = Vec::new();
    for f in &files {
        if module_of(&src, f).is_empty() {
            continue;
        }
        let text = without_comments_and_tests(&std::fs::read_to_string(f).unwrap());
        for (is_crate, segs) in paths(&text) {
            // `crate::Name...` where `Name` is no module of src/: a lib.rs re-export.
            let first = &segs[0];
            if is_crate && !src.join(first).is_dir() && !src.join(format!("{first}.rs")).exists() {
                let file = f.strip_prefix(&src).unwrap().display().to_string();
                bad.push(format!("src/{file}: crate::{}", segs.join("::")));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} paths through lib.rs re-exports:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
