//! Checks over the repository's own files, run by `cargo test -p cohort-checks`:
//!
//! - [`layering`]: every crate's modules form layers: no two source files import each
//!   other, and no module reaches up to one that imports it;
//! - the docs index (tests/docs_index.rs): docs/README.md links every document in docs/;
//! - [`history`]: the docs, comments and scripts speak of the product as it is now: no
//!   tracker issue numbers, no rounds of work by ordinal, no dated "tried" notes, no
//!   documents outside the repository.
//!
//! The rules are pure functions over text, tested on injected lines; the tests in
//! `tests/` apply them to the tree.

pub mod history;
pub mod layering;
pub mod tree;
