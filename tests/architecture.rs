//! The layering rules, checked on the source itself: the service reaches the engine only
//! through each domain's root (its facade and the facade's command, result and error types),
//! and no two files of one crate (`src/`, `actors/src/`, `actors/kernel/src/`) import each other,
//! directly or through others.
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

#[test]
fn no_file_of_the_engine_or_the_service_imports_itself_through_others() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["actors/kernel/src", "actors/src", "src"] {
        let graph = import_graph(&root.join(dir));
        assert!(graph.len() > 10, "{dir}: the scan found the modules");
        let found = cycles(&graph);
        assert!(found.is_empty(), "import cycles in {dir}: {found:#?}");
    }
}

#[test]
fn the_service_uses_only_domain_roots_of_the_engine() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut offenders = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        for path in paths(&text.replace("corvid_actors::", "crate::__engine__::")) {
            let Some(rest) = path.strip_prefix("crate::__engine__::") else {
                continue;
            };
            let segs: Vec<&str> = rest.split("::").collect();
            // `domain::Item` or `domain::function`; a third lower-case segment is a submodule.
            let deep = segs.len() > 2
                && segs[..segs.len() - 1]
                    .iter()
                    .skip(1)
                    .any(|s| s.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
            if deep || segs.first() == Some(&"bench") {
                offenders.push(format!("{}: corvid_actors::{rest}", file.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "engine internals used by the service: {offenders:#?}"
    );
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
