"""MiniMax H3's frame rate and the durations it generates: the rules a request (`models.request.params`) and a reference
clip (`models.inputs.clips`) are both held to."""

FPS = 24
"""MiniMax H3's fixed frame rate (`MiniMaxH3ModularPipeline.fps`); diffusers resamples a reference clip onto it."""
MIN_SECONDS, MAX_SECONDS = 5.0, 15.0
"""The durations H3 generates (`MiniMaxH3ModularPipeline.min_duration` / `max_duration`)."""
