"""LoRAs: a LoRA file as a generate input (checked at submit), and its merge into the DiT while the loader
streams it."""
