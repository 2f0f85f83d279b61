"""Altair chart builders: pure functions from data frames to charts.

No `st.*` calls and no database access here, so each builder is tested by
calling it and reading `.to_dict()`. Every builder checks the columns it needs
and raises ValueError naming the missing ones; an empty frame gives a valid,
empty chart.

- `frames`: samples turned into the rows and units the axes read (no Altair);
- `style`: fixed series colours (Okabe-Ito; red only for the wall or a kill) and theme palettes;
- `memory`: the Job page's memory chart, one small function per layer;
- `compare`: the Compare page's small multiples;
- `quality`: Compare's A/B, PSNR and SSIM per frame;
- `host`: the machine's own bars and history (pool, fit forecast, PSI).
"""

from dashboard.charts.compare import JOB_DASHES, MAX_COMPARED, compare_chart, job_dashes, mode_dashes
from dashboard.charts.frames import (
    LABEL_GAP,
    MEMORY_COLUMNS,
    Limit,
    compare_frame,
    end_label_positions,
    fitting_labels,
    from_first_placement,
    job_limits,
    limit_rows,
    memory_frames,
    stage_spans,
)
from dashboard.charts.quality import quality_chart, quality_frame
from dashboard.charts.memory import STRIP_PX, memory_chart, series_color_scale, stage_strip
from dashboard.charts.style import POLICY, PREDICTED, SERIES, WALL, Series

__all__ = [
    "JOB_DASHES", "LABEL_GAP", "MAX_COMPARED", "MEMORY_COLUMNS", "POLICY", "PREDICTED", "SERIES",
    "STRIP_PX", "WALL", "Limit", "Series", "compare_chart", "compare_frame", "end_label_positions",
    "fitting_labels", "from_first_placement", "job_dashes", "job_limits", "limit_rows", "memory_chart",
    "memory_frames", "mode_dashes", "quality_chart", "quality_frame",
    "series_color_scale", "stage_spans", "stage_strip",
]
