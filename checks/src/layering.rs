//! Module layering, workspace-wide: within every crate, the source files' imports point
//! one way.
//!
//! Each `.rs` file is a module (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs` and
//! `main.rs` the crate root). A file *uses* another when its code names it by path:
//! `crate::a::b`, `super::b`, `self::b` (in a `use` or inline, braces expanded), resolved
//! to the deepest module that exists. A child naming its ancestors' items is how a module
//! folder is built (the parent declares the child and re-exports from it), so edges from a
//! module to its own ancestors are not counted; every other edge is. Then:
//!
//! - no two files use each other;
//! - no longer circle either: the graph has no cycle, so its modules fall into layers and
//!   none reaches up to a layer that uses it.
//!
//! Comments and `#[cfg(test)]` blocks at the end of a file are not read (doc links and
//! tests' `use super::*` name modules without depending on them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's modules and the edges between them, by module path (`""` is the root).
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Module path → the file it lives in (repository-relative, for messages).
    pub files: BTreeMap<String, String>,
    /// Module path → the modules it uses (ancestors left out).
    pub uses: BTreeMap<String, BTreeSet<String>>,
}

/// The module path of `file` under `src` (`None` for files outside the module tree, such
/// as `src/bin/*`).
pub fn module_path(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let mut segments: Vec<String> = parts.clone();
    let last = segments.pop()?;
    let stem = last.strip_suffix(".rs")?;
    match stem {
        "lib" | "main" if segments.is_empty() => {}
        "mod" => {}
        other => segments.push(other.to_owned()),
    }
    Some(segments.join("::"))
}

/// The code of a file, without comment lines and without a trailing `#[cfg(test)]` module.
pub fn code_of(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..cut]
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a use tree (`a::{b, c::{d, E}}`) into its paths (`a::b`, `a::c::d`, `a::c::E`).
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        out.push(join(prefix, path));
    }
}

fn join(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (true, _) => path.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}::{path}"),
    }
}

/// Every path the code names that starts at `crate`, `super` or `self`.
pub fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // `use` trees, braces expanded.
    for statement in code.split(';') {
        let s = statement.trim_start();
        let s = s
            .strip_prefix("pub(crate) ")
            .or_else(|| s.strip_prefix("pub(super) "))
            .or_else(|| s.strip_prefix("pub "))
            .unwrap_or(s);
        if let Some(tree) = s.strip_prefix("use ") {
            let mut expanded = Vec::new();
            expand(tree, "", &mut expanded);
            paths.extend(expanded.into_iter().filter(|p| {
                p.starts_with("crate::") || p.starts_with("super::") || p.starts_with("self::")
            }));
        }
    }
    // Inline paths.
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| is_ident_char(c) || c == ':') {
                continue;
            }
            let rest = &code[at..];
            let end = rest
                .find(|c: char| !(is_ident_char(c) || c == ':'))
                .unwrap_or(rest.len());
            let path = rest[..end].trim_end_matches(':');
            if !path.contains('{') {
                paths.push(path.to_owned());
            }
        }
    }
    paths
}

/// The module a path names, seen from module `from`: the deepest existing module along it.
pub fn resolve(path: &str, from: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    match segments.first() {
        Some(&"crate") => {
            base.clear();
            segments.remove(0);
        }
        Some(&"self") => {
            segments.remove(0);
        }
        Some(&"super") => {
            while segments.first() == Some(&"super") {
                segments.remove(0);
                base.pop()?;
            }
        }
        _ => return None,
    }
    let mut best = None;
    let mut current = base.join("::");
    if modules.contains(&current) {
        best = Some(current.clone());
    }
    for s in segments {
        current = join(&current, s);
        if modules.contains(&current) {
            best = Some(current.clone());
        } else {
            break;
        }
    }
    best
}

fn is_ancestor(ancestor: &str, of: &str) -> bool {
    ancestor.is_empty() || of.starts_with(&format!("{ancestor}::"))
}

/// Builds the graph of one crate from its `src` folder.
pub fn graph_of(src: &Path, files: &[PathBuf], relative: impl Fn(&Path) -> String) -> ModuleGraph {
    let mut graph = ModuleGraph::default();
    let mut codes = Vec::new();
    for file in files {
        if file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let Some(module) = module_path(src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap_or_default();
        graph.files.insert(module.clone(), relative(file));
        codes.push((module, code_of(&text)));
    }
    let modules: BTreeSet<String> = graph.files.keys().cloned().collect();
    for (module, code) in codes {
        let mut uses = BTreeSet::new();
        for path in named_paths(&code) {
            if let Some(target) = resolve(&path, &module, &modules) {
                if target != module && !is_ancestor(&target, &module) {
                    uses.insert(target);
                }
            }
        }
        graph.uses.insert(module, uses);
    }
    graph
}

impl ModuleGraph {
    /// Pairs of files that use each other.
    pub fn mutual(&self) -> Vec<(String, String)> {
        let mut pairs = Vec::new();
        for (a, uses) in &self.uses {
            for b in uses {
                if a < b && self.uses.get(b).is_some_and(|u| u.contains(a)) {
                    pairs.push((a.clone(), b.clone()));
                }
            }
        }
        pairs
    }

    /// A cycle of modules, if the graph has one (each uses the next, the last the first).
    pub fn cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut marks: BTreeMap<&str, Mark> =
            self.uses.keys().map(|k| (k.as_str(), Mark::New)).collect();
        fn visit<'a>(
            node: &'a str,
            graph: &'a ModuleGraph,
            marks: &mut BTreeMap<&'a str, Mark>,
            stack: &mut Vec<&'a str>,
        ) -> Option<Vec<String>> {
            marks.insert(node, Mark::Open);
            stack.push(node);
            for next in graph.uses.get(node).into_iter().flatten() {
                match marks.get(next.as_str()).copied() {
                    Some(Mark::Open) => {
                        let from = stack.iter().position(|&n| n == next).unwrap_or(0);
                        return Some(stack[from..].iter().map(|s| s.to_string()).collect());
                    }
                    Some(Mark::New) => {
                        if let Some(cycle) = visit(next, graph, marks, stack) {
                            return Some(cycle);
                        }
                    }
                    _ => {}
                }
            }
            stack.pop();
            marks.insert(node, Mark::Done);
            None
        }
        let nodes: Vec<&str> = self.uses.keys().map(|k| k.as_str()).collect();
        for node in nodes {
            if marks.get(node) == Some(&Mark::New) {
                let mut stack = Vec::new();
                if let Some(cycle) = visit(node, self, &mut marks, &mut stack) {
                    return Some(cycle);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn paths_resolve_to_the_deepest_module() {
        let m = modules(&["", "policy", "policy::load", "store"]);
        assert_eq!(
            resolve("crate::policy::load::Decay", "store", &m).as_deref(),
            Some("policy::load")
        );
        assert_eq!(
            resolve("super::load", "policy::owners", &m).as_deref(),
            Some("policy::load")
        );
        assert_eq!(
            resolve("super::Policy", "policy::owners", &m).as_deref(),
            Some("policy")
        );
        assert_eq!(
            resolve("self::load::X", "policy", &m).as_deref(),
            Some("policy::load")
        );
        assert_eq!(resolve("crate::Thing", "store", &m).as_deref(), Some(""));
    }

    #[test]
    fn use_trees_are_expanded() {
        let code = "use crate::{config::X, front::{a, b::C}};\nlet f = crate::serve::run();";
        let paths = named_paths(code);
        for p in [
            "crate::config::X",
            "crate::front::a",
            "crate::front::b::C",
            "crate::serve::run",
        ] {
            assert!(paths.iter().any(|q| q == p), "{p} not in {paths:?}");
        }
    }

    #[test]
    fn module_paths_follow_the_files() {
        let src = Path::new("/x/src");
        assert_eq!(
            module_path(src, Path::new("/x/src/lib.rs")).as_deref(),
            Some("")
        );
        assert_eq!(
            module_path(src, Path::new("/x/src/a/mod.rs")).as_deref(),
            Some("a")
        );
        assert_eq!(
            module_path(src, Path::new("/x/src/a/b.rs")).as_deref(),
            Some("a::b")
        );
        assert_eq!(module_path(src, Path::new("/x/src/bin/t.rs")), None);
    }

    #[test]
    fn circles_are_found_and_ancestors_are_not_circles() {
        let mut g = ModuleGraph::default();
        g.uses.insert("a".into(), ["b".into()].into());
        g.uses.insert("b".into(), ["c".into()].into());
        g.uses.insert("c".into(), BTreeSet::new());
        assert!(g.cycle().is_none());
        assert!(g.mutual().is_empty());
        g.uses.insert("c".into(), ["a".into()].into());
        assert_eq!(g.cycle().map(|c| c.len()), Some(3));
        g.uses.insert("b".into(), ["a".into(), "c".into()].into());
        assert_eq!(g.mutual(), vec![("a".to_string(), "b".to_string())]);
    }
}
