"""Where the dashboard listens, and refusing to serve beyond localhost unless asked to.

The dashboard can queue jobs that read any checkpoint under the model roots and
fill the machine's memory, so it must not be reachable from the network by
accident. Streamlit takes its address from the `.streamlit/config.toml` of the
working directory (and, in recent versions, of app.py's folder): started from
elsewhere, an older Streamlit listens on every interface. So the app checks the
address it was actually bound to, and serves beyond loopback only when the
Drainboard configuration (`DRAINBOARD_ADDRESS` or drainboard.toml's `address`)
names that same address.
"""

from __future__ import annotations

import ipaddress

WILDCARDS = frozenset({"", "0.0.0.0", "::"})
"""Addresses that mean "every interface" (unset is one of them)."""


def is_loopback(address: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_refusal(bound: str | None, configured: str) -> str | None:
    """Why the dashboard must not serve on `bound` (Streamlit's server.address; None or ""
    when unset, i.e. every interface), given the configured Drainboard address; None when it may."""
    bound = (bound or "").strip()
    if bound and is_loopback(bound):
        return None
    configured = (configured or "").strip()
    if bound == configured or (bound in WILDCARDS and configured in WILDCARDS):
        return None
    where = "every network interface" if bound in WILDCARDS else bound
    return (
        f"This dashboard is listening on {where}, but Drainboard is configured for {configured or 'localhost'}: "
        "anyone who can reach this machine could queue jobs on it. Restart it bound to localhost "
        "(`python -m dashboard`, or `streamlit run app.py --server.address 127.0.0.1`), or, to serve the "
        f"network on purpose, set DRAINBOARD_ADDRESS={bound or '0.0.0.0'} as well."
    )
