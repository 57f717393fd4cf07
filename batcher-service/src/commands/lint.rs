//! `cohort lint`: checks prompt templates for what breaks prefix caching — variables
//! before the fixed instructions, per-request values (dates, ids) early on, a shared
//! prefix with little in it — and scores each 0–1
//! ([`cohort_score::template`]). Exits 1 when a template scores below
//! `--min-score` (0.3), so a CI job can keep cache-hostile templates out.

use super::inputs::{expand, verdict, Format, ScoreOptions};
use anyhow::{Context, Result};
use cohort_score::template::{analyse, TemplateReport, DEFAULT_VARIABLE_BYTES};
use serde_json::json;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Template files or quoted globs (`'prompts/**/*.j2'`).
    #[arg(required = true)]
    templates: Vec<String>,
    /// Expected size of one variable's value, bytes.
    #[arg(long, default_value_t = DEFAULT_VARIABLE_BYTES)]
    variable_bytes: usize,
    #[command(flatten)]
    options: ScoreOptions,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut reports: Vec<(String, TemplateReport)> = Vec::new();
    for (_, path) in expand(&args.templates)? {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        reports.push((
            path.display().to_string(),
            analyse(&text, args.variable_bytes, args.options.block_bytes),
        ));
    }
    match args.options.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "templates": reports.iter().map(|(t, r)| json!({"template": t, "report": r})).collect::<Vec<_>>(),
                "min_score": args.options.min_score,
            }))?
        ),
        Format::Table => {
            println!(
                "{:<40}  {:>5}  {:>12}  {:>9}  {:>12}  verdict",
                "template", "score", "prefix bytes", "variables", "entropy bits"
            );
            for (template, r) in &reports {
                let verdict = if r.score < args.options.min_score {
                    "FAIL"
                } else {
                    "ok"
                };
                println!(
                    "{template:<40}  {:>5.3}  {:>12}  {:>9}  {:>12.0}  {verdict}",
                    r.score, r.prefix_bytes, r.placeholders, r.prefix_entropy_bits
                );
                for finding in &r.findings {
                    println!("    - {finding}");
                }
            }
        }
    }
    Ok(verdict(
        reports.iter().map(|(_, r)| r.score),
        args.options.min_score,
    ))
}
