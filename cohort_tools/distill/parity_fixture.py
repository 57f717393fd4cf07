"""Writes data/sketch/wordpiece_parity.jsonl: texts and the teacher tokenizer's ids.

Why: `fingerprint/tests/wordpiece_parity.rs` checks the Rust WordPiece tokenizer against
HF `tokenizers` (the teacher's tokenizer.json) without Python at test time. Texts: the
first 2,500 segments of the distillation corpus (ShareGPT, awesome-chatgpt-prompts, T0,
Self-Instruct; cut to 240 characters) plus hand-written edge cases (accents, CJK, emoji,
scripts with combining marks, invisible characters, long words).
Usage: python -m cohort_tools.distill.parity_fixture SHARED_DATA_DIR TOKENIZER_JSON OUT
"""
import json
import sys

from tokenizers import Tokenizer

from cohort_tools.distill import corpus

EDGE_CASES = [
    "Café CRÈME brûlée, naïve résumé — façade",
    "東京で寿司を食べたい 我想退款 한국어 문장입니다",
    "emoji 🚀🔥 and ❤️ flags 🇫🇷 keycaps 1️⃣",
    "zero\u200bwidth\u200dand\u00adsoft hyphen\ufeff",
    "Ελληνικά ΚΕΦΑΛΑΊΑ, русский ТЕКСТ, עברית, العربية",
    "हिन्दी में लिखा गया वाक्य, தமிழ் எழுத்து",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp",
    "ﬁ ligature, ＦＵＬＬＷＩＤＴＨ, ℌ𝔢𝔩𝔩𝔬, Ⅻ",
    "a" * 101 + " short",
    "x" * 100 + " y",
    "don't won't I'm it's user@example.com https://a.b/c?d=1#e",
    "C++ C# .NET node.js $100 50% #hashtag @handle ~/path/to/file.py",
    "\u0000null\ufffdreplacement\u0007bell",
]


def main(data_dir, tokenizer_json, out_path, count=2500):
    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = [text[:240] for _, text in corpus.build(data_dir)[:count]] + EDGE_CASES
    with open(out_path, "w", encoding="utf-8") as f:
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
