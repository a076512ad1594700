"""The model (stations 5-15): its configuration (`config`), the GPT itself (`gpt`), and the loss computed without the full logits (`fused_loss`)."""
