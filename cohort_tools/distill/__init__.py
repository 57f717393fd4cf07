"""The sketch's distillation and evaluation (scripts/distill-sketch, scripts/fit-codebook,
scripts/eval-sketch; docs/SKETCH.md): the version-2 sketch table fitted to all-MiniLM-L6-v2,
the cohort codebook, and the tables that measure them. Runs in .venv-distill (numpy, scipy,
safetensors, tokenizers)."""
