"""Evaluate a saved checkpoint with the official `openai` client, through a running `make serve`: greedy
completions of a few prompts from the base model and from the checkpoint, side by side.

    .venv/bin/python examples/openai_eval.py tinker://<model_id>/sampler_weights/<name> [--base-url ...]

The path is what `TrainingClient.save_weights_for_sampler(name).result().path` returned to the same API key.
"""

from __future__ import annotations

import argparse

import openai

PROMPTS = ["What is 12 + 7? The answer", "What is 3 + 4? The answer", "What is 9 + 9? The answer"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", help="a tinker:// sampler_weights (or weights) path your key may read")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--base-model", default="tinker-serve/tiny")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key="tml-example")  # the key that saved it
    for prompt in PROMPTS:
        answers = [
            client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
            for model in (args.base_model, args.checkpoint)
        ]
        print(f"{prompt!r}\n  base:       {answers[0]!r}\n  checkpoint: {answers[1]!r}")
    chat = client.chat.completions.create(
        model=args.checkpoint, messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=16, temperature=0
    )
    print(f"chat: {chat.choices[0].message.content!r}")


if __name__ == "__main__":
    main()
