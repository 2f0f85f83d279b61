"""The files a generate request names besides its checkpoint: images, reference clips (and Qwen3-VL's
video processor that reads them), each checked before a job is queued."""
