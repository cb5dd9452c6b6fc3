"""Images in ModelInputs: their headers read without decoding (`header`), their vision-token counts from a base's
processor (`tokens`), and the bounds and checks an image chunk passes before any engine time (`checks`). No torch,
PIL or transformers: the ingress imports it."""
