"""Supervised fine-tuning of a LoRA on the embedded tiny model through a running `make serve`, then
sampling the trained adapter with vLLM.

    .venv/bin/python examples/sft.py [--base-url http://127.0.0.1:8000] [--steps 20]
"""

from __future__ import annotations

import argparse

import tinker
from tinker import types

LINES = ["What is 12 + 7? The answer is 19.", "What is 3 + 4? The answer is 7.", "What is 9 + 9? The answer is 18."]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    service = tinker.ServiceClient(base_url=args.base_url, api_key="tml-example")
    trainer = service.create_lora_training_client(base_model="tinker-serve/tiny", rank=8, seed=0).result()
    tokenizer = trainer.get_tokenizer()
    data = []
    for line in LINES:
        ids = tokenizer.encode(line)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
            )
        )
    tokens = sum(len(d.model_input.to_ints()) for d in data)
    for step in range(args.steps):
        fb = trainer.forward_backward(data, "cross_entropy")
        opt = trainer.optim_step(types.AdamParams(learning_rate=3e-3))
        loss = fb.result().metrics["loss:sum"]
        opt.result()
        print(f"step {step:3d}  loss/token {loss / tokens:.3f}")
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = tokenizer.encode("What is 12 + 7? The answer is")
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    completion = sampler.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences[0]
    print(
        f"greedy completion of {tokenizer.decode(prompt)!r}: {tokenizer.decode(completion.tokens)!r} "
        f"(mean logprob {sum(completion.logprobs) / len(completion.logprobs):.2f})"
    )
    service.close("success").result()


if __name__ == "__main__":
    main()
