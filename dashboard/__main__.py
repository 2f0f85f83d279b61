"""`python -m dashboard`: start the dashboard on the configured address and port.

Reads DRAINBOARD_ADDRESS / DRAINBOARD_PORT (or drainboard.toml's address/port)
and runs `streamlit run app.py` with them; plain `streamlit run app.py` binds
127.0.0.1:8501 from .streamlit/config.toml.
"""

from __future__ import annotations

import os
import sys

from dashboard.nav import ROOT
from storage.config import ConfigError, load_config


def main(argv: list[str]) -> int:
    try:
        config = load_config()
    except ConfigError as e:
        print(f"drainboard: {e}", file=sys.stderr)
        return 2
    command = [
        sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"),
        "--server.address", config.address, "--server.port", str(config.port), *argv,
    ]
    print(f"Drainboard on http://{config.address}:{config.port} (data: {config.data_dir})", file=sys.stderr)
    os.chdir(ROOT)
    os.execv(sys.executable, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
