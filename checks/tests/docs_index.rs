//! docs/README.md indexes every document in docs/, and names only documents that exist.

use cohort_checks::tree::root;

#[test]
fn the_docs_index_names_every_doc() {
    let docs = root().join("docs");
    let index = std::fs::read_to_string(docs.join("README.md")).expect("docs/README.md");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&docs).expect("docs/") {
        let name = entry.expect("a docs/ entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".md") && name != "README.md" && !index.contains(&format!("({name})")) {
            missing.push(name.into_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/README.md does not link {missing:?}"
    );
    for (at, _) in index.match_indices("](") {
        let target = &index[at + 2..];
        let target = &target[..target.find(')').unwrap_or(target.len())];
        let path = target.split('#').next().unwrap_or(target);
        if path.is_empty() || path.contains("://") {
            continue;
        }
        assert!(
            docs.join(path).exists(),
            "docs/README.md links {target}, which is not there"
        );
    }
}
