"""Weight-only quantization of the DiT with torchao, and whether a device can run it (torch-free)."""
