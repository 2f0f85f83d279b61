"""A MiniMax H3 checkpoint: the formats a generate can or cannot run, its components' classes, each
component built empty and filled by the loader, the local tokenizer and processor."""
