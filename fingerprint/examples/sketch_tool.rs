//! The sketch as a filter over texts, for the offline distillation and evaluation scripts.
//!
//! Reads one JSON string per line on stdin and writes one line per input:
//! - `sketch_tool rows`: the table rows the text selects, `id:class` (class C content,
//!   A asking, F function, M mask, S symbol) — what `scripts/distill-sketch` fits;
//! - `sketch_tool sketch <version> <mode>`: the 32 int8 values of the sketch (the exact
//!   code the filter runs), for `scripts/eval-sketch`;
//! - `sketch_tool wordpiece`: the teacher-tokenizer ids of the raw text;
//! - `sketch_tool cohort <threshold>`: the cohort code (codebook level and centroid, as
//!   the filter computes it in intent mode; `4294967295` for no intent), for
//!   `scripts/eval-sketch --grouping`.
//!
//! Errors (bad arguments, a line that is not a JSON string) go to stderr with exit code 2.

use cohort_fingerprint::sketch::distilled::for_each_row;
use cohort_fingerprint::sketch::table::Table;
use cohort_fingerprint::sketch::words::WordClass;
use cohort_fingerprint::{mask, normalize, IntentSketch, SemanticMode, Sketch};
use std::io::{BufRead, BufWriter, Write};

fn fail(message: &str) -> ! {
    eprintln!("sketch_tool: {message}");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let table = Table::embedded().unwrap_or_else(|| fail("embedded table is invalid"));
    let stdin = std::io::stdin();
    let mut out = BufWriter::new(std::io::stdout().lock());
    for (n, line) in stdin.lock().lines().enumerate() {
        let line = line.unwrap_or_else(|e| fail(&format!("stdin: {e}")));
        let text: String = serde_json::from_str(&line)
            .unwrap_or_else(|e| fail(&format!("line {}: not a JSON string: {e}", n + 1)));
        let fields: Vec<String> = match args.first().map(String::as_str) {
            Some("rows") => {
                let tokens = mask::tokenize(&normalize::normalize(&text));
                let mut fields = Vec::new();
                for_each_row(table, &tokens, |id, class| {
                    let c = match class {
                        WordClass::Content => 'C',
                        WordClass::Asking => 'A',
                        WordClass::Function => 'F',
                        WordClass::Mask => 'M',
                        WordClass::Symbol => 'S',
                    };
                    fields.push(format!("{id}:{c}"));
                });
                fields
            }
            Some("sketch") => {
                let version = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
                let mode = args
                    .get(2)
                    .and_then(|m| SemanticMode::parse(m))
                    .unwrap_or_else(|| {
                        fail("usage: sketch_tool sketch <1|2> <intent|topic|hybrid>")
                    });
                let tokens = mask::tokenize(&normalize::normalize(&text));
                let sketch = Sketch::of_version(version, &tokens, mode)
                    .unwrap_or_else(|| fail("unknown sketch version"));
                sketch.0.iter().map(|v| v.to_string()).collect()
            }
            Some("cohort") => {
                let threshold = args
                    .get(1)
                    .and_then(|t| t.parse().ok())
                    .unwrap_or_else(|| fail("usage: sketch_tool cohort <threshold>"));
                let intent = IntentSketch::of_text(&text, SemanticMode::Intent);
                vec![intent.cohort(threshold).to_string()]
            }
            Some("wordpiece") => table
                .vocab
                .encode(&text)
                .iter()
                .map(|v| v.to_string())
                .collect(),
            _ => fail("usage: sketch_tool rows | sketch <version> <mode> | wordpiece | cohort <threshold>"),
        };
        writeln!(out, "{}", fields.join(" ")).unwrap_or_else(|e| fail(&format!("stdout: {e}")));
    }
}
