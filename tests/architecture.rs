//! The layering rules, checked on the source itself: the engine's crates depend only on lower
//! layers; no crate (an engine crate, the service, its tests or benchmarks) names another
//! domain's inner module, only its root (its facade and the facade's command, result and error
//! types); and no two files of one crate import each other, directly or through others.
//!
//! A "file imports another" when it names a path (`use crate::…`, `super::…`, inline
//! `crate::…`) that resolves to the other file's module. A parent module naming its own
//! children (declaring them, re-exporting their items) is structure, not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a/b/mod.rs` and `a/b.rs` are module `a::b`; `lib.rs` is the crate root.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under root");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// The file's code without inline test modules (`#[cfg(test)]` then `mod … {`), whose
/// `super` means the file itself.
fn code_without_inline_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        if line.trim() == "#[cfg(test)]" && next.contains("mod ") && next.ends_with('{') {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| {
            if p == "self" {
                prefix.trim_end_matches("::").to_string()
            } else {
                format!("{prefix}{p}")
            }
        })
        .collect()
}

/// Every `crate::`/`super::`/`self::` path a file names.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before_ok = at == 0
            || !rest.as_bytes()[at - 1].is_ascii_alphanumeric() && rest.as_bytes()[at - 1] != b'_';
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        let tree: String = after[..end].split_whitespace().collect();
        let well_formed = !tree.is_empty()
            && tree
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_:{},*".contains(c))
            && tree.matches('{').count() == tree.matches('}').count();
        if before_ok && well_formed {
            out.extend(expand(&tree));
        }
        rest = &after[end.min(after.len())..];
    }
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let len = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - at);
            out.push(code[at..at + len].trim_end_matches(':').to_string());
        }
    }
    out
}

/// The module a path names: the longest prefix that is a module of the crate.
fn resolve(here: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut abs: Vec<String> = match *segs.first()? {
        "crate" => Vec::new(),
        "self" | "super" => here.to_vec(),
        _ => return None,
    };
    while segs.first() == Some(&"super") {
        abs.pop();
        segs.remove(0);
    }
    if matches!(segs.first(), Some(&"crate") | Some(&"self")) {
        segs.remove(0);
    }
    abs.extend(segs.iter().map(|s| s.to_string()));
    (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|m| modules.contains(m))
}

/// Import edges between modules of the crate under `root`.
fn import_graph(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(root, f)).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let here = module_of(root, file);
        let code = code_without_inline_tests(&std::fs::read_to_string(file).expect("readable"));
        let targets = graph.entry(here.clone()).or_default();
        for path in paths(&code) {
            let Some(target) = resolve(&here, &path, &modules) else {
                continue;
            };
            // A module naming itself or its own descendants is structure, not an import.
            if target.starts_with(&here) {
                continue;
            }
            targets.insert(target);
        }
    }
    graph
}

/// Cycles, each as the modules on it (Tarjan's strongly connected components).
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let empty = BTreeSet::new();
        let graph = s.graph;
        for w in graph.get(v).unwrap_or(&empty) {
            let Some((w, _)) = graph.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.join("::"));
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// The engine's crates bottom up (`actors/<dir>`, package `corvid-<dir>`): a crate may depend
/// only on crates of lower layers.
const LAYERS: &[&[&str]] = &[
    &["kernel"],
    &["activity"],
    &["tenancy", "persons", "webhooks"],
    &["events", "flags", "oauth"],
    &["query"],
    &["endpoints", "surfaces", "lifecycle"],
    &["engine"],
];

/// Public modules that are doors of their own: the four product surfaces share one crate, and
/// `testing` is the test-support fixture a crate lends other crates' tests. The kernel is not
/// a domain: its modules are its interface.
const DOOR_MODULES: &[(&str, &str)] = &[
    ("surfaces", "early_access"),
    ("surfaces", "experiments"),
    ("surfaces", "remote_config"),
    ("surfaces", "surveys"),
    ("events", "testing"),
    ("query", "testing"),
];

fn layer_of(name: &str) -> usize {
    LAYERS
        .iter()
        .position(|layer| layer.contains(&name))
        .unwrap_or_else(|| panic!("crate actors/{name} is in no layer"))
}

fn engine_crates() -> Vec<String> {
    LAYERS
        .iter()
        .flat_map(|l| l.iter().map(|s| s.to_string()))
        .collect()
}

/// Every `corvid_<name>::…` path the code names (in `use` trees and inline).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out: Vec<String> = paths(code)
        .into_iter()
        .filter(|p| p.starts_with("corvid_"))
        .collect();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(i) = code[from..].find("corvid_") {
        let at = from + i;
        from = at + 1;
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let len = code[at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(code.len() - at);
        let path = code[at..at + len].trim_end_matches(':');
        if path.contains("::") {
            out.push(path.to_string());
        }
    }
    out
}

/// The inner (non-door) modules of engine crate `name`: every module below its root.
fn inner_modules(root: &Path, name: &str) -> BTreeSet<String> {
    let src = root.join("actors").join(name).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_of(&src, f).first().cloned())
        .collect();
    // Inline `mod x {` blocks of the root.
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    for line in lib.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("mod ").or(line.strip_prefix("pub mod ")) {
            out.insert(rest.trim_end_matches(['{', ';', ' ']).to_string());
        }
    }
    out.retain(|m| !DOOR_MODULES.contains(&(name, m.as_str())));
    out
}

/// Where a crate's sources are: the engine crates, the service, its tests and benchmarks.
fn source_dirs(root: &Path) -> Vec<(String, PathBuf)> {
    let mut dirs: Vec<(String, PathBuf)> = engine_crates()
        .into_iter()
        .map(|c| (c.clone(), root.join("actors").join(&c).join("src")))
        .collect();
    for dir in ["src", "tests", "benches"] {
        dirs.push(("corvid".to_string(), root.join(dir)));
    }
    dirs
}

/// Every `crate → crate::module` edge where a crate names another domain's inner module.
fn deep_edges(root: &Path) -> BTreeSet<String> {
    let inner: BTreeMap<String, BTreeSet<String>> = engine_crates()
        .into_iter()
        .filter(|c| c != "kernel")
        .map(|c| {
            let modules = inner_modules(root, &c);
            (c, modules)
        })
        .collect();
    let mut offenders = BTreeSet::new();
    for (from, dir) in source_dirs(root) {
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for file in &files {
            let code = std::fs::read_to_string(file).expect("readable");
            for path in crate_paths(&code) {
                let mut segs = path.split("::");
                let target = segs.next().unwrap_or("").trim_start_matches("corvid_");
                let Some(modules) = inner.get(target) else {
                    continue;
                };
                let first = segs.next().unwrap_or("");
                // `corvid_x::name` is a root item even when a module shares its name.
                let deeper = segs.next().is_some();
                if target != from && deeper && modules.contains(first) {
                    offenders.insert(format!(
                        "{} (corvid-{from} → corvid-{target}::{first}): {path}",
                        file.display()
                    ));
                }
            }
        }
    }
    offenders
}

/// The `corvid-*` packages crate `name` depends on (its `[dependencies]` table).
fn engine_dependencies(root: &Path, name: &str) -> Vec<String> {
    let manifest =
        std::fs::read_to_string(root.join("actors").join(name).join("Cargo.toml")).expect("toml");
    let mut in_deps = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps {
            if let Some(dep) = line.strip_prefix("corvid-") {
                out.push(dep.split(['.', ' ', '=']).next().unwrap_or("").to_string());
            }
        }
    }
    out
}

#[test]
fn no_file_of_a_crate_imports_itself_through_others() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, dir) in source_dirs(root) {
        if !dir.join("lib.rs").exists() && !dir.join("main.rs").exists() {
            continue;
        }
        let graph = import_graph(&dir);
        assert!(!graph.is_empty(), "{name}: the scan found the modules");
        let found = cycles(&graph);
        assert!(
            found.is_empty(),
            "import cycles in {}: {found:#?}",
            dir.display()
        );
    }
}

#[test]
fn no_crate_names_another_domains_inner_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        inner_modules(root, "flags").contains("store"),
        "the scan sees modules"
    );
    let offenders = deep_edges(root);
    assert!(
        offenders.is_empty(),
        "paths into another domain's inner modules (use its root): {offenders:#?}"
    );
}

#[test]
fn engine_crates_depend_only_on_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut offenders = Vec::new();
    for name in engine_crates() {
        for dep in engine_dependencies(root, &name) {
            if layer_of(&dep) >= layer_of(&name) {
                offenders.push(format!("corvid-{name} → corvid-{dep}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "dependencies running up or sideways: {offenders:#?}"
    );
    assert!(engine_dependencies(root, "engine").contains(&"flags".to_string()));
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    let graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = [
        (m("a"), [m("b")].into()),
        (m("b"), [m("c")].into()),
        (m("c"), [m("a")].into()),
        (m("d"), [m("a")].into()),
    ]
    .into();
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].len(), 3);
    assert_eq!(
        expand("a::{b, c::{d, e as f}, self}"),
        vec!["a::b", "a::c::d", "a::c::e", "a"]
    );
}
