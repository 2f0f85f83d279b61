"""The speed levers (what each is, torch-free), putting them on a loaded DiT, and `--plan fastest`."""
