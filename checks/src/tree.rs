//! The repository's files, as the checks read them.

use std::path::{Path, PathBuf};

/// The repository root (this crate lives in `checks/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("checks/ has a parent")
        .to_path_buf()
}

/// Folders no check reads: build outputs, installed tools, bundled data sets (their text
/// is the data's, not ours), benchmark results and git itself.
const SKIPPED_DIRS: [&str; 9] = [
    "target",
    ".git",
    ".venv",
    ".cohort",
    "data",
    "results",
    "node_modules",
    "corpus",
    "artifacts",
];

/// Every file under `dir`, skipping [`SKIPPED_DIRS`], in a stable order.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_ref()) {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// `path` relative to the repository root, with `/` separators.
pub fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}
