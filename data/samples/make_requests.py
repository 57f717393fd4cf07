"""Builds data/samples/requests.jsonl, the `cohort fingerprint` sample (run from the repo root).

Three applications (real system prompts from awesome-chatgpt-prompts) receive real user
turns (Banking77) through the OpenAI chat, Anthropic messages and OpenAI responses shapes;
bare completions fill three templates with different variables; three lines are bad input.
Deterministic: the same files give the same output.
"""
import csv
import json

apps = [json.loads(line) for line in open("data/prompts/system_prompts.jsonl")][:3]
rows = list(csv.DictReader(open("data/intent/banking77_test.csv")))
intents = ["card_arrival", "lost_or_stolen_card", "exchange_rate", "pending_transfer", "refund_not_showing_up",
           "change_pin"]
turns = {i: [r["text"] for r in rows if r["category"] == i][:4] for i in intents}

lines = []
for n, app in enumerate(apps):
    for intent in intents:
        for text in turns[intent][:2] if n else turns[intent]:
            if n == 0:
                body = {"model": "gemma-3-270m", "messages": [{"role": "system", "content": app["prompt"]},
                                                              {"role": "user", "content": text}]}
            elif n == 1:
                body = {"model": "gemma-3-270m", "max_tokens": 64, "system": app["prompt"],
                        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
            else:
                body = {"model": "gemma-3-270m", "instructions": app["prompt"],
                        "input": [{"role": "user", "content": text}]}
            lines.append(body)

templates = [
    "Please refund order {n} for {name}, receipt at {url}",
    "Send invoice {id} to {email} by tomorrow",
    "Why was my payment of ${n} to {name} declined?",
]
fills = [("1234", "Mary Ann", "https://shop.example.com/r/1", "INV-2024-0042", "jane@example.com"),
         ("98", "Oleksandr", "http://a.io/x", "AB12CD9", "bob.s@corp.example"),
         ("7,500.00", "Lisbon Travel", "www.example.org/receipt?id=9", "550e8400-e29b-41d4-a716-446655440000",
          "z@q.example")]
for t in templates:
    for n, name, url, id_, email in fills:
        lines.append({"model": "gemma-3-270m", "prompt": t.format(n=n, name=name, url=url, id=id_, email=email)})

with open("data/samples/requests.jsonl", "w") as out:
    for body in lines:
        out.write(json.dumps(body, ensure_ascii=False) + "\n")
    out.write('{"model": "gemma-3-270m", "messages": [\n')
    out.write('{"model": "gemma-3-270m", "messages": []}\n')
    out.write('{"model": "text-embedding-3-small", "input_ids": [1, 2, 3]}\n')
