//! The direction data flows in, checked on the source: each layer imports
//! only from the layers below it (capture and host below state, state
//! below analysis, analysis below output, output below modes), and no two
//! files of one layer import each other, directly or round a circle. The
//! eBPF crate's files are held to the second rule too.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// A layer may import from layers of a lower rank, and from its own.
fn rank(layer: &str) -> Option<u8> {
    Some(match layer {
        "event" | "escape" | "units" | "signals" => 0,
        "capture" | "host" => 1,
        "state" => 2,
        "analysis" => 3,
        "output" => 4,
        "modes" => 5,
        "cli" | "lib" | "main" => 6,
        _ => return None,
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `state/failures.rs` -> ["state", "failures"]; `state/mod.rs` -> ["state"].
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut m: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into()).collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// Test code may reach anywhere: only what ships is checked.
fn is_test(module: &[String]) -> bool {
    module
        .iter()
        .any(|c| c == "tests" || c.ends_with("_tests") || c == "fixture")
}

/// The code of a file without comments and without its test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a `use` tree ("a::{b, c::{d}}") into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect();
    fn go(prefix: &str, s: &str, out: &mut Vec<String>) {
        let join = |p: &str, x: &str| {
            if p.is_empty() {
                x.to_string()
            } else {
                format!("{p}::{x}")
            }
        };
        match s.find('{') {
            None => out.push(join(prefix, s.split(" as ").next().unwrap_or(s))),
            Some(i) => {
                let head = s[..i].trim_end_matches("::");
                let inner = &s[i + 1..s.rfind('}').unwrap()];
                let p = join(prefix, head);
                let mut depth = 0;
                let mut start = 0;
                for (j, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            go(&p, &inner[start..j], out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                if start < inner.len() {
                    go(&p, &inner[start..], out);
                }
            }
        }
    }
    let mut out = Vec::new();
    go("", &tree, &mut out);
    out
}

/// Every module path a file's code names (`use` trees and inline paths),
/// made absolute from `crate`, `super` and `self`.
fn imports(module: &[String], is_mod_rs: bool, code: &str) -> BTreeSet<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = String::new();
    // `use` statements start a line (after `pub`, `pub(crate)`...).
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let t = match t.strip_prefix("pub") {
            Some(r) if r.starts_with(' ') || r.starts_with('(') => {
                r.split_once(' ').map_or("", |(_, x)| x).trim_start()
            }
            _ => t,
        };
        let Some(tree) = t.strip_prefix("use ") else {
            rest.push_str(line);
            rest.push('\n');
            continue;
        };
        let mut stmt = tree.to_string();
        while !stmt.contains(';') {
            match lines.next() {
                Some(l) => stmt.push_str(l),
                None => break,
            }
        }
        let stmt = stmt.split(';').next().unwrap_or("");
        paths.extend(expand(stmt));
    }
    // Inline paths: crate::a::b, super::a, self::a.
    let bytes = rest.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = rest[from..].find(start) {
            let i = from + i;
            from = i + start.len();
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            let end = rest[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(rest.len(), |e| i + e);
            paths.push(rest[i..end].trim_end_matches(':').to_string());
        }
    }
    // The module `super` and `self` are relative to.
    let here: Vec<String> = if is_mod_rs {
        module.to_vec()
    } else {
        module[..module.len().saturating_sub(0)].to_vec()
    };
    let mut out = BTreeSet::new();
    for p in paths {
        let mut parts: Vec<&str> = p.split("::").filter(|x| !x.is_empty()).collect();
        let mut abs: Vec<String> = match parts.first().copied() {
            Some("crate") => {
                parts.remove(0);
                Vec::new()
            }
            Some("self") => {
                parts.remove(0);
                if is_mod_rs {
                    here.clone()
                } else {
                    module[..module.len() - 1].to_vec()
                }
            }
            Some("super") => {
                let mut base = if is_mod_rs {
                    here.clone()
                } else {
                    module[..module.len() - 1].to_vec()
                };
                while parts.first() == Some(&"super") {
                    parts.remove(0);
                    // The first super is the parent module; more climb on.
                    if base.len() == module.len() - usize::from(!is_mod_rs) && !is_mod_rs {
                        continue;
                    }
                    base.pop();
                }
                base
            }
            _ => continue,
        };
        abs.extend(parts.iter().map(|x| x.to_string()));
        out.insert(abs);
    }
    out
}

struct Tree {
    /// Module -> the modules (files) it imports from.
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    /// mod.rs, lib.rs and main.rs: they route to their files.
    roots: BTreeSet<Vec<String>>,
}

fn tree(root: &Path) -> Tree {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(root, f)).collect();
    let mut edges = BTreeMap::new();
    let mut roots = BTreeSet::new();
    for f in &files {
        let m = module_of(root, f);
        if is_test(&m) {
            continue;
        }
        let is_mod_rs = f
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        if is_mod_rs {
            roots.insert(m.clone());
        }
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        let mut to = BTreeSet::new();
        for p in imports(&m, is_mod_rs, &code) {
            // The longest prefix that is a file of the crate.
            if let Some(target) = (1..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|c| modules.contains(c))
                && target != m
            {
                to.insert(target);
            }
        }
        edges.insert(m, to);
    }
    Tree { edges, roots }
}

/// A circle among sibling files (a layer's root, its mod.rs, routes to
/// its files and is left out), as the files on it.
fn circle(t: &Tree) -> Option<Vec<Vec<String>>> {
    let is_root = |m: &Vec<String>| t.roots.contains(m);
    fn visit(
        t: &Tree,
        m: &Vec<String>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
        is_root: &dyn Fn(&Vec<String>) -> bool,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(i) = stack.iter().position(|x| x == m) {
            return Some(stack[i..].to_vec());
        }
        if !done.insert(m.clone()) {
            return None;
        }
        stack.push(m.clone());
        for next in t.edges.get(m).into_iter().flatten() {
            if is_root(next) {
                continue;
            }
            if let Some(c) = visit(t, next, stack, done, is_root) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in t.edges.keys().filter(|m| !is_root(m)) {
        if let Some(c) = visit(t, m, &mut Vec::new(), &mut done, &is_root) {
            return Some(c);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn each_layer_imports_only_from_the_layers_below_it() {
    let t = tree(&src());
    let mut wrong = Vec::new();
    for (from, tos) in &t.edges {
        let layer = from.first().map_or("lib", |s| s.as_str());
        let Some(r) = rank(layer) else {
            wrong.push(format!("{} is in no layer", from.join("::")));
            continue;
        };
        for to in tos {
            let other = to[0].as_str();
            match rank(other) {
                Some(o) if o < r || other == layer => {}
                _ => wrong.push(format!("{} imports {}", from.join("::"), to.join("::"))),
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the flow: {wrong:#?}");
}

#[test]
fn no_two_files_import_each_other() {
    let mut t = tree(&src());
    let mut found = Vec::new();
    // Each circle found is cut at its first edge, so that all are listed.
    while let Some(c) = circle(&t) {
        let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
        found.push(names.join(" -> "));
        let next = c.get(1).unwrap_or(&c[0]).clone();
        t.edges.get_mut(&c[0]).unwrap().remove(&next);
    }
    let ebpf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shmtrace-ebpf/src");
    if let Some(c) = circle(&tree(&ebpf)) {
        let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
        found.push(format!("eBPF: {}", names.join(" -> ")));
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

#[test]
fn use_trees_and_relative_paths_resolve() {
    let m = vec!["analysis".to_string(), "pytorch".to_string()];
    let got = imports(
        &m,
        false,
        "use super::{diagnosis::{A, b}, scope::Scope};\nfn f() { crate::state::failures::X; self::g(); }",
    );
    let want: BTreeSet<Vec<String>> = [
        "analysis::diagnosis::A",
        "analysis::diagnosis::b",
        "analysis::scope::Scope",
        "state::failures::X",
        "analysis::g",
    ]
    .iter()
    .map(|s| s.split("::").map(String::from).collect())
    .collect();
    assert_eq!(got, want);
    // A circle is found, and a layer root routing to its files is none.
    let e = |a: &str, b: &[&str]| {
        (
            a.split("::").map(String::from).collect::<Vec<_>>(),
            b.iter()
                .map(|x| x.split("::").map(String::from).collect())
                .collect::<BTreeSet<Vec<String>>>(),
        )
    };
    let t = Tree {
        edges: [
            e("a", &["a::x"]),
            e("a::x", &["a", "a::y"]),
            e("a::y", &["a::x"]),
        ]
        .into_iter()
        .collect(),
        roots: [vec!["a".to_string()]].into_iter().collect(),
    };
    assert_eq!(circle(&t).map(|c| c.len()), Some(2));
    let t = Tree {
        edges: [e("a", &["a::x"]), e("a::x", &["a", "a::y"]), e("a::y", &[])]
            .into_iter()
            .collect(),
        roots: [vec!["a".to_string()]].into_iter().collect(),
    };
    assert_eq!(circle(&t), None);
}

/// Whether `text` has `name` as a word of its own (not inside another).
fn names(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// DESIGN.md names every file of both crates (`name.rs`) and every eBPF
/// program: a module or program added without its place in the design
/// fails here.
#[test]
fn the_design_note_names_every_file_and_program() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let design = std::fs::read_to_string(root.join("DESIGN.md")).unwrap();
    let (mut missing, mut programs) = (Vec::new(), 0);
    for dir in ["shmtrace/src", "shmtrace-ebpf/src"] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for f in files {
            let m = module_of(&root.join(dir), &f);
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            if is_test(&m) || ["mod.rs", "lib.rs", "main.rs"].contains(&name.as_str()) {
                continue;
            }
            if !names(&design, &name) {
                missing.push(format!("{dir}/{}", m.join("/")));
            }
            if dir.ends_with("ebpf/src") {
                let text = std::fs::read_to_string(&f).unwrap();
                let mut lines = text.lines().map(str::trim);
                while let Some(l) = lines.next() {
                    let hook = [
                        "#[tracepoint",
                        "#[raw_tracepoint",
                        "#[uretprobe",
                        "#[btf_tracepoint",
                        "#[kprobe",
                        "#[fentry",
                        "#[fexit",
                    ]
                    .iter()
                    .any(|a| l.starts_with(a));
                    if !hook {
                        continue;
                    }
                    // The attribute may span lines; the fn follows it.
                    let Some(name) = lines
                        .by_ref()
                        .find_map(|d| d.strip_prefix("pub fn "))
                        .and_then(|r| r.split('(').next())
                    else {
                        continue;
                    };
                    programs += 1;
                    if !design.contains(&format!("`{name}`")) {
                        missing.push(format!("eBPF program {name}"));
                    }
                }
            }
        }
    }
    // Every program was found (a change of attribute style would hide them).
    assert!(programs >= 15, "only {programs} eBPF programs found");
    assert!(missing.is_empty(), "DESIGN.md does not name: {missing:#?}");
}

#[test]
fn a_file_is_named_only_as_a_word_of_its_own() {
    assert!(names("see `run.rs` and more", "run.rs"));
    assert!(names("run.rs, pid.rs", "pid.rs"));
    assert!(!names("prun.rs", "run.rs"));
    assert!(!names("run.rsx", "run.rs"));
}
