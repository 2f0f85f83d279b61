"""A generate request: its parameters and H3's rules for them, its command-line arguments, and the
few-step presets that fill what it leaves unset."""
