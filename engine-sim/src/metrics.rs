//! A replica's `/metrics` page in Prometheus text format with vLLM's metric names, so
//! scrapers written for vLLM (Cohort's own engine watch, the peers' dashboards) read it
//! unchanged. `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` count
//! tokens, as in vLLM v1; `vllm:prompt_tokens_cached_total` is what vLLM exports with
//! `--enable-prompt-tokens-details` (Cohort's vLLM adapter reads it).

use crate::replica::{Replica, TTFT_BUCKETS_S};
use std::fmt::Write as _;

/// The page for `replica` (index `index`) serving `model`, as of `now_ms`.
pub fn page(replica: &Replica, index: usize, model: &str, now_ms: f64) -> String {
    let stats = replica.stats(now_ms);
    let labels = format!(
        "model_name=\"{}\",engine=\"{index}\"",
        model.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Requests holding a slot.",
        replica.running() as f64,
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Requests waiting for a slot.",
        replica.waiting() as f64,
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "Fraction of KV cache blocks in use (0-1).",
        replica.kv_usage(),
    );
    let counters: [(&str, &str, u64); 7] = [
        (
            "vllm:prompt_tokens_total",
            "Prompt tokens.",
            stats.prompt_tokens,
        ),
        (
            "vllm:generation_tokens_total",
            "Generated tokens.",
            stats.generation_tokens,
        ),
        (
            "vllm:prompt_tokens_cached_total",
            "Prompt tokens served from the prefix cache.",
            stats.cached_tokens,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in tokens.",
            stats.prompt_tokens,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in tokens.",
            stats.cached_tokens,
        ),
        (
            "vllm:request_success_total",
            "Finished requests.",
            stats.completed,
        ),
        (
            "vllm:num_preemptions_total",
            "Preemptions (never, here).",
            0,
        ),
    ];
    for (name, help, value) in counters {
        metric(name, "counter", help, value as f64);
    }
    let (counts, sum, count) = replica.ttft_histogram();
    let name = "vllm:time_to_first_token_seconds";
    let _ = writeln!(out, "# HELP {name} Time to first token, from receipt.");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (bound, n) in TTFT_BUCKETS_S.iter().zip(counts) {
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::block_hashes;
    use crate::cost::CostModel;

    #[test]
    fn the_page_carries_vllm_names_and_moves_with_the_counters() {
        let cost = CostModel {
            prefill_base_ms: 1.0,
            prefill_ms_per_token: 0.0,
            prefill_attention_ms: 0.0,
            decode_ms_per_token: 1.0,
            decode_batch_slowdown: 0.0,
        };
        let mut r = Replica::new(10, 2, cost);
        let h = block_hashes(&[1, 2, 3, 4, 5], 2, None);
        for _ in 0..2 {
            r.enqueue();
            r.start(0.0);
            r.admit(&h, 5, 0.0);
            r.prefill_done(&h, 12.0);
            r.token();
            r.finish(1.0, true);
        }
        let text = page(&r, 3, "m\"x", 2.0);
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{name}{{")))
                .unwrap_or_else(|| panic!("{name} missing"))
                .rsplit(' ')
                .next()
                .unwrap()
                .parse::<f64>()
                .unwrap()
        };
        assert_eq!(line("vllm:prompt_tokens_total"), 10.0);
        assert_eq!(line("vllm:prefix_cache_hits_total"), 4.0);
        assert_eq!(line("vllm:prompt_tokens_cached_total"), 4.0);
        assert_eq!(line("vllm:generation_tokens_total"), 2.0);
        assert_eq!(line("vllm:request_success_total"), 2.0);
        assert_eq!(line("vllm:num_requests_running"), 0.0);
        assert_eq!(line("vllm:kv_cache_usage_perc"), 0.2);
        assert!(text.contains("engine=\"3\""));
        assert!(text.contains("model_name=\"m\\\"x\""));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",engine=\"3\",le=\"0.02\"} 2"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\",engine=\"3\"} 2"
        ));
    }
}
