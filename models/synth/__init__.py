"""Synthetic MiniMax H3 checkpoints: named sizes of the real architecture, random weights written
streaming."""
