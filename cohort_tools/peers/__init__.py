"""The peer benchmark (scripts/bench-peers): Cohort against Envoy, sglang-router and vllm-router
on the same workloads and fresh engines. run is the runner, contenders starts the routers,
workloads builds the requests, client replays them, report writes the tables and plots."""
