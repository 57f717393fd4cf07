//! `cohort score`: how batch-friendly a prompt workload is (0–1), per group of prompts.
//!
//! Input: JSONL files (one API request body per line — chat, completions, responses,
//! messages — or `{"text": …}`), or plain text files (each file one prompt). Prompts are
//! grouped per file, or per value of a JSONL field with `--group-by` (a template id, a
//! calling service). The score is [`cohort_score::corpus`]: prefix reuse
//! from the filter's block hashes and cohort concentration from its sketches. Exits 1
//! when a group scores below `--min-score` (0.3).

use super::inputs::{expand, verdict, Format, Progress, ScoreOptions};
use anyhow::{Context, Result};
use cohort_fingerprint::{api, IntentSketch, SemanticMode};
use cohort_score::corpus::{chained_blocks, CorpusScore, CorpusScorer};
use cohort_score::cost::CostModel;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Files or quoted globs (`'logs/*.jsonl'`).
    #[arg(required = true)]
    inputs: Vec<String>,
    /// Group JSONL lines by this field instead of by file.
    #[arg(long)]
    group_by: Option<String>,
    #[command(flatten)]
    options: ScoreOptions,
    /// Effective-cost model: the cost of one prompt token computed from scratch.
    #[arg(long, default_value_t = CostModel::default().base)]
    cost_base: f64,
    /// Effective-cost model: the extra cost of a prompt that reuses nothing, as a share
    /// of base.
    #[arg(long, default_value_t = CostModel::default().miss_penalty)]
    cost_miss_penalty: f64,
}

/// One prompt: a request body, or plain text wrapped as one user message.
fn body_of(line: &Value) -> Vec<u8> {
    match line.get("text").and_then(Value::as_str) {
        Some(text) => json!({"messages": [{"role": "user", "content": text}]})
            .to_string()
            .into_bytes(),
        None => line.to_string().into_bytes(),
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let files = expand(&args.inputs)?;
    let mut prompts: Vec<(String, Vec<u8>)> = Vec::new();
    for (_, path) in &files {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let name = path.display().to_string();
        let jsonl = path
            .extension()
            .is_some_and(|e| e == "jsonl" || e == "json");
        if !jsonl {
            prompts.push((name, body_of(&json!({"text": text}))));
            continue;
        }
        for (number, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let value: Value = serde_json::from_str(line)
                .with_context(|| format!("{name}:{}: not JSON", number + 1))?;
            let group = match &args.group_by {
                Some(field) => match value.get(field) {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => format!("{name} (no {field})"),
                },
                None => name.clone(),
            };
            prompts.push((group, body_of(&value)));
        }
    }
    let mut groups: BTreeMap<String, CorpusScorer> = BTreeMap::new();
    let mut unparsed = 0usize;
    let mut progress = Progress::new(prompts.len());
    for (group, body) in &prompts {
        progress.tick();
        match api::parse_request(body, None) {
            Ok(prompt) => {
                let blocks = chained_blocks(prompt.bytes(), args.options.block_bytes);
                let sketch = prompt
                    .last_user_text()
                    .map(|text| IntentSketch::of_text(text, SemanticMode::Intent).sketch);
                groups
                    .entry(group.clone())
                    .or_default()
                    .add(&blocks, sketch.as_ref());
            }
            Err(_) => unparsed += 1,
        }
    }
    let model = CostModel {
        base: args.cost_base,
        miss_penalty: args.cost_miss_penalty,
    };
    let usable = |x: f64| x.is_finite() && x >= 0.0;
    if !usable(model.base) || !usable(model.miss_penalty) {
        anyhow::bail!("--cost-base and --cost-miss-penalty must be finite and not negative");
    }
    let mut rows: Vec<(String, CorpusScore)> =
        groups.into_iter().map(|(g, s)| (g, s.finish())).collect();
    let cost = |s: &CorpusScore| model.effective(s.prefix_reuse, s.hit_ratio);
    rows.sort_by(|a, b| b.1.score.total_cmp(&a.1.score).then(a.0.cmp(&b.0)));
    match args.options.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "groups": rows.iter().map(|(g, s)| json!({"group": g, "score": s, "effective_cost": cost(s)})).collect::<Vec<_>>(),
                "cost_model": model,
                "unparsed": unparsed,
                "min_score": args.options.min_score,
            }))?
        ),
        Format::Table => {
            let width = rows
                .iter()
                .map(|(g, _)| g.len())
                .max()
                .unwrap_or(5)
                .clamp(5, 60);
            println!(
                "{:<width$}  {:>7}  {:>6}  {:>12}  {:>13}  {:>7}  {:>5}  {:>9}",
                "group",
                "prompts",
                "blocks",
                "prefix reuse",
                "concentration",
                "cohorts",
                "score",
                "eff. cost"
            );
            for (group, s) in &rows {
                let group: String = group.chars().take(width).collect();
                println!(
                    "{group:<width$}  {:>7}  {:>6}  {:>12.3}  {:>13.3}  {:>7}  {:>5.3}  {:>9.3}",
                    s.prompts,
                    s.blocks,
                    s.prefix_reuse,
                    s.concentration,
                    s.cohorts,
                    s.score,
                    cost(s)
                );
            }
            println!(
                "eff. cost: per prompt token, base {} × (1 − prefix reuse) × (1 + {} × (1 − share of prompts reusing any block))",
                model.base, model.miss_penalty
            );
            if unparsed > 0 {
                println!("{unparsed} lines were not an API request body or a text line: skipped");
            }
        }
    }
    Ok(verdict(
        rows.iter().map(|(_, s)| s.score),
        args.options.min_score,
    ))
}
