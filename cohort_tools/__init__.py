"""Cohort's Python: the live scripts, the benchmarks and the sketch's distillation, one package.

Modules (each runs as `python -m cohort_tools.<module>` from the repository root; the
commands in scripts/ are launchers of them):

  stack                processes, ports, Envoy, the streaming client, percentiles (shared)
  envoy_config         istio/envoy/*.yaml parsed and adapted for a run on loopback
  demo                 scripts/demo: Cohort vs round-robin on three llama-server replicas
  bench_batch          scripts/bench-batch: batch mode vs round-robin and affinity
  bench_prefetch       scripts/bench-prefetch: prefetch and the first request's TTFT
  bench_front_latency  scripts/bench-front-latency: what the batch front adds to one request
  build_oci            scripts/build-oci: the filter as an OCI image layout for Istio
  metrics_shape        scripts/metrics-shape: the shape of `cohort serve` /metrics pages
  peers/               scripts/bench-peers: Cohort against other routers on the same engines
  bench/               the filter's and the sketch's costs inside Envoy, the engine simulator's calibration
  distill/             scripts/distill-sketch, fit-codebook, eval-sketch: the sketch table and codebook

Tests: `python -m unittest discover -s cohort_tools -t .` (part of scripts/test).
"""
