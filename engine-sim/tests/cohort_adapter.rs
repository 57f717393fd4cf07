//! `cohort serve` scrapes engines through its adapters (batcher-service/core engines): the
//! simulator, configured as `engine = "vllm"`, must be read by the vLLM adapter exactly like a
//! vLLM, from the page the simulator really serves.

use cohort_batcher_core::engines::EngineKind;
use cohort_engine_sim::cache::block_hashes;
use cohort_engine_sim::cost::CostModel;
use cohort_engine_sim::metrics::page;
use cohort_engine_sim::replica::Replica;
use cohort_engine_sim::tokenizer::tokenize;

#[test]
fn cohort_vllm_adapter_reads_the_sim_metrics() {
    let cost = CostModel {
        prefill_base_ms: 1.0,
        prefill_ms_per_token: 0.1,
        prefill_attention_ms: 0.0,
        decode_ms_per_token: 1.0,
        decode_batch_slowdown: 0.0,
    };
    let mut replica = Replica::new(64, 16, cost);
    let tokens = tokenize(&"shared system prompt ".repeat(20));
    let hashes = block_hashes(&tokens, 16, None);
    for _ in 0..2 {
        replica.enqueue();
        replica.start(0.0);
        replica.admit(&hashes, tokens.len(), 0.0);
        replica.prefill_done(&hashes, 5.0);
        replica.finish(6.0, true);
    }
    replica.enqueue(); // one waiting
    replica.enqueue();
    replica.start(7.0); // one running
    let text = page(&replica, 0, "sim-model", 8.0);
    let engine = EngineKind::parse("vllm").unwrap().adapter();
    assert_eq!(engine.health_path(), "/health");
    assert_eq!(engine.metrics_path(), Some("/metrics"));
    let m = engine.parse_metrics(&text);
    assert_eq!(m.prompt_tokens_total, Some(2.0 * tokens.len() as f64));
    let cached = replica.stats(8.0).cached_tokens as f64;
    assert!(cached > 0.0);
    assert_eq!(m.cached_tokens_total, Some(cached));
    assert_eq!(m.running, Some(1.0));
    assert_eq!(m.waiting, Some(1.0));
    let usage = m.kv_usage.unwrap();
    assert!(usage > 0.0 && usage <= 1.0, "{usage}");
}
