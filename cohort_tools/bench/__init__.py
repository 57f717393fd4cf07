"""Benchmarks of what the filter costs inside Envoy and of the engine simulator's calibration:
filter_overhead (Envoy + buffer filter vs Envoy + Cohort), added_time (what the filter adds to
time to first token), sketch_wasm (the fingerprint's time inside Envoy's V8) and
engine_sim_calibrate (`cohort engine-sim` against a real llama-server)."""
