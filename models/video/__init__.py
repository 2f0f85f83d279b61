"""The MP4 a generate run writes: its encoding, and the settings it carries in its metadata."""
