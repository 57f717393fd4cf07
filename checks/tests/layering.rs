//! Every crate of the workspace keeps its modules in layers (rules in
//! `cohort_checks::layering`): no two source files use each other, and no circle.

use cohort_checks::layering::graph_of;
use cohort_checks::tree::{files, relative, root};
use std::path::PathBuf;

/// Every crate's `src` folder: each folder with a `Cargo.toml` and a `src/` beside it.
fn crate_sources() -> Vec<PathBuf> {
    files(&root())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "Cargo.toml"))
        .filter_map(|manifest| {
            let src = manifest.parent()?.join("src");
            src.is_dir().then_some(src)
        })
        .collect()
}

#[test]
fn every_crate_is_layered() {
    let crates = crate_sources();
    assert!(crates.len() >= 10, "found only {crates:?}");
    let mut problems = Vec::new();
    for src in &crates {
        let graph = graph_of(src, &files(src), relative);
        for (a, b) in graph.mutual() {
            problems.push(format!(
                "{} and {} use each other",
                graph.files[&a], graph.files[&b]
            ));
        }
        if let Some(cycle) = graph.cycle() {
            let names: Vec<&str> = cycle.iter().map(|m| graph.files[m].as_str()).collect();
            problems.push(format!("a circle: {}", names.join(" → ")));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
