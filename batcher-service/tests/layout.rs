//! The binary's module layout keeps one direction: leaves at the bottom, `serve` on top.
//!
//! | layer | modules | may use |
//! |---|---|---|
//! | 0 | `audit`, `clock`, `config`, `metrics` | nothing of the binary |
//! | 1 | `fleet`, `kv_events` | layer 0 |
//! | 2 | `front`, `discovery` | layers 0–1 |
//! | 3 | `serve` | layers 0–2 |
//! | 4 | `commands` | everything |
//!
//! And inside a module folder, no two sibling files use each other (a child using its
//! parent's `mod.rs` items is how the folder is built; siblings in a circle are not).
//! The check reads the sources: every `crate::name` path and every `super::name` path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: [(&str, u8); 11] = [
    ("audit", 0),
    ("clock", 0),
    ("config", 0),
    ("metrics", 0),
    ("fleet", 1),
    ("kv_events", 1),
    ("front", 2),
    ("discovery", 2),
    ("serve", 3),
    ("commands", 4),
    ("main", 5),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (doc links name modules too).
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names that follow `prefix` in `text` (`crate::front::Front` → `front`), including
/// those in a grouped `use crate::{a, b}`.
fn paths_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                names.insert(ident(item.trim()));
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.remove("");
    names
}

fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The top-level module a source file belongs to (`src/front/admit.rs` → `front`).
fn top_module(path: &Path) -> String {
    let relative = path.strip_prefix(src()).unwrap();
    let first = relative.components().next().unwrap();
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_owned()
}

fn violations() -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let module = top_module(file);
        let Some(own) = layer(&module) else {
            problems.push(format!("{module}: not in the layer table"));
            continue;
        };
        for used in paths_after(&code(file), "crate::") {
            match layer(&used) {
                Some(other) if used != module && other >= own => problems.push(format!(
                    "{}: {module} (layer {own}) uses crate::{used} (layer {other})",
                    file.display()
                )),
                _ => {}
            }
        }
    }
    problems.extend(sibling_circles(&files));
    problems
}

/// Pairs of sibling files (same folder, neither the folder's `mod.rs`) that use each
/// other through `super::`.
fn sibling_circles(files: &[PathBuf]) -> Vec<String> {
    let mut uses: BTreeMap<(PathBuf, String), BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let dir = file.parent().unwrap().to_owned();
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        if stem == "mod" || stem == "main" {
            continue;
        }
        uses.insert((dir, stem), paths_after(&code(file), "super::"));
    }
    let mut circles = Vec::new();
    for ((dir, a), used) in &uses {
        for b in used {
            let back = uses.get(&(dir.clone(), b.clone()));
            if a < b && back.is_some_and(|u| u.contains(a)) {
                circles.push(format!(
                    "{}: {a}.rs and {b}.rs use each other",
                    dir.display()
                ));
            }
        }
    }
    circles
}

#[test]
fn modules_depend_downwards_only() {
    let problems = violations();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_sees_paths_and_groups() {
    let text = "use crate::{config::X, fleet};\nlet f = crate::front::Front::new();\nlet g = my_crate::serve;";
    let names: Vec<_> = paths_after(text, "crate::").into_iter().collect();
    assert_eq!(names, ["config", "fleet", "front"]);
    assert_eq!(layer("front"), Some(2));
    assert_eq!(layer("nowhere"), None);
}
