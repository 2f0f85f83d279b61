"""The foundation, the machine, storage and the job-kind list import without torch (the CLI and the dashboard
list jobs and read settings without paying torch's import); torch loads on first use of a loader
function that needs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_storage_and_the_job_kind_list_import_without_torch():
    out = _run(
        "import json, sys\n"
        "import loader, core, core.command_line, core.sizes, core.diskspace, machine, machine.offload_option\n"
        "import storage.config, storage.schema, storage.artifacts, storage.sample_writer\n"
        "import storage.queries, jobs.context\n"
        "from jobs.kinds import kind_names\n"
        "from core import CheckpointError, DrainboardError\n"
        "print(json.dumps({'kinds': list(kind_names()), 'torch': 'torch' in sys.modules}))\n"
    )
    assert out == {"kinds": ["generate", "load"], "torch": False}


def test_the_jobs_command_line_lists_and_cancels_without_torch():
    out = _run(
        "import json, sys\n"
        "import jobs.cli, jobs.queue, jobs.documents\n"
        "from jobs.errors import JobSpecError\n"
        "jobs.cli.build_parser()  # the --mode help names the placement modes only when printed\n"
        "print(json.dumps({'torch': 'torch' in sys.modules}))\n"
    )
    assert out == {"torch": False}


def test_a_loader_function_that_needs_torch_imports_it_on_first_use():
    out = _run(
        "import json, sys\n"
        "import loader\n"
        "before = 'torch' in sys.modules\n"
        "fn = loader.load_checkpoint\n"
        "print(json.dumps({'before': before, 'after': 'torch' in sys.modules, 'name': fn.__name__,"
        " 'unknown': hasattr(loader, 'no_such_name')}))\n"
    )
    assert out == {"before": False, "after": True, "name": "load_checkpoint", "unknown": False}
