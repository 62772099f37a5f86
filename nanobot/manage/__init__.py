"""Managing an installation from the command line: onboarding, status, pairing, cron jobs,
approvals, taint, MCP servers, memory search, usage.

Each function sets up logging, opens what it needs, does one thing and returns lines for the
CLI to print. None of them imports litellm or the chat libraries. Each command's work is in
a module of its own; import from here: this is the package's surface.
"""

from nanobot.manage._approvals import approvals
from nanobot.manage._cron import PICKUP_WAIT, added_line, cron, job_lines, run_job, run_lines
from nanobot.manage._gateway_lock import GATEWAY_LOCK, gateway_pid, lock_holder
from nanobot.manage._mcp import mcp_list, mcp_rows
from nanobot.manage._memory import memory_search
from nanobot.manage._onboarding import onboard
from nanobot.manage._pairing import pairing
from nanobot.manage._people import people_export, people_forget, people_link, people_list
from nanobot.manage._status import health, status
from nanobot.manage._taint import taint
from nanobot.manage._usage import usage_report

__all__ = [
    "GATEWAY_LOCK",
    "PICKUP_WAIT",
    "added_line",
    "approvals",
    "cron",
    "gateway_pid",
    "health",
    "job_lines",
    "lock_holder",
    "mcp_list",
    "mcp_rows",
    "memory_search",
    "onboard",
    "pairing",
    "people_export",
    "people_forget",
    "people_link",
    "people_list",
    "run_job",
    "run_lines",
    "status",
    "taint",
    "usage_report",
]
