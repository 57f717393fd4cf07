"""The distillation corpus: broad LLM-prompt text, none of it from the evaluation sets.

Why: the sketch table is fitted so that sums of token rows reproduce the teacher's sentence
embeddings; what it learns is only as broad as these texts. They are real prompts of other
domains (ShareGPT user turns, role/system prompts, T0 task templates, Self-Instruct
instructions) cut into short segments (a sentence or line, 3–48 words), the length of a
typical request's intent text. Banking77 and HWU64 — the evaluation sets — are never read
here. Deterministic: the same source files give the same corpus, in the same order.

Sources (see data/README.md for commits and licences), under the shared data directory:
prompts/sharegpt_v3_first_human_turns.jsonl, prompts/sharegpt_v3_conversations_first2000.jsonl,
prompts/awesome_chatgpt_prompts.csv, prompts/t0_templated_prompts_dev.jsonl,
prompts/selfinstruct_user_oriented_instructions.jsonl.
"""
import csv
import json
import random
import re

csv.field_size_limit(1 << 24)
SEGMENT = re.compile(r"(?<=[.!?])\s+|\n+")


def segments(text, max_segments):
    """Up to `max_segments` sentence/line segments of 3–48 words, whitespace collapsed."""
    out = []
    for piece in SEGMENT.split(text):
        words = piece.split()
        if 3 <= len(words) <= 48:
            out.append(" ".join(words))
        elif len(words) > 48:
            out.append(" ".join(words[:48]))
        if len(out) >= max_segments:
            break
    return out


def build(data_dir, seed=7):
    """The corpus as a list of (source, text), deduplicated: `part("base") + part("more")`.

    The base part takes the first segments of each text (2 per ShareGPT first turn, 4 per
    role prompt, 2 per T0 prompt, …); the second part the next ones (up to 8 per text).
    They are built and cached separately so that widening the corpus keeps the first
    part's teacher embeddings.
    """
    return part(data_dir, "base", seed) + part(data_dir, "more", seed)


# (source, first segments in "base", segments in "base" + "more") per text.
LIMITS = {
    "sharegpt_first": (2, 6),
    "sharegpt_followup": (1, 3),
    "awesome_prompts": (4, 8),
    "t0": (2, 8),
    "selfinstruct_instruction": (3, 3),
    "selfinstruct_input": (2, 2),
}


def part(data_dir, which, seed=7):
    """One part of the corpus ("base" or "more"), shuffled, without texts of the parts before."""
    def take(source, text):
        base, wide = LIMITS[source]
        pieces = segments(text, wide)
        chosen = pieces[:base] if which == "base" else pieces[base:]
        return [(source.split("_")[0] if source.startswith("selfinstruct") else source, s)
                for s in chosen]

    rows = []
    with open(f"{data_dir}/prompts/sharegpt_v3_first_human_turns.jsonl", encoding="utf-8") as f:
        for line in f:
            rows += take("sharegpt_first", json.loads(line)["first_human"])
    with open(f"{data_dir}/prompts/sharegpt_v3_conversations_first2000.jsonl", encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line)["conversations"]
            for text in [t["value"] for t in turns if t.get("from") == "human"][1:]:
                rows += take("sharegpt_followup", text)
    with open(f"{data_dir}/prompts/awesome_chatgpt_prompts.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            rows += take("awesome_prompts", row["prompt"])
    with open(f"{data_dir}/prompts/t0_templated_prompts_dev.jsonl", encoding="utf-8") as f:
        for line in f:
            rows += take("t0", json.loads(line)["prompt"])
    with open(f"{data_dir}/prompts/selfinstruct_user_oriented_instructions.jsonl", encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            rows += take("selfinstruct_instruction", item["instruction"])
            for instance in item.get("instances", []):
                rows += take("selfinstruct_input", instance.get("input", ""))
    seen = set()
    if which == "more":
        seen = {text.lower() for _, text in part(data_dir, "base", seed)}
    unique = []
    for source, text in rows:
        key = text.lower()
        if key not in seen:
            seen.add(key)
            unique.append((source, text))
    random.Random(seed).shuffle(unique)
    return unique


if __name__ == "__main__":
    import collections
    import sys
    for which in ("base", "more"):
        corpus = part(sys.argv[1], which)
        print(which, len(corpus), collections.Counter(s for s, _ in corpus))
        print(sum(len(t.split()) for _, t in corpus) / len(corpus), "words per text")
