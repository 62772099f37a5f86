"""nanobot's configuration: one typed tree, loaded once, failing loudly.

The YAML file is found at `--config PATH`, else `$NANOBOT_CONFIG`, else
`~/.nanobot/config.yaml`. Environment variables `NANOBOT_<SECTION>__<KEY>` override the file.
Every component receives its own section; nothing reads configuration files after start-up.

The sections live in modules of their own (`agent`, `channels`, `tools`, `automation`,
`gateway`, `store`, `mcp`), the whole tree in `tree`, and finding, reading and checking the file
and the environment in `loading`. Import from here: this is the package's surface.
"""

from nanobot.config.agent import AgentConfig, ModelPrice
from nanobot.config.automation import ChatTarget, CronConfig, HeartbeatConfig
from nanobot.config.budget import BudgetConfig, PersonBudget
from nanobot.config.channels import (
    ChannelConfig,
    ChannelsConfig,
    DiscordConfig,
    TelegramConfig,
    TelegramWebhookConfig,
)
from nanobot.config.gateway import ClusterConfig, GatewayConfig, LogConfig
from nanobot.config.loading import (
    DEFAULT_CONFIG_PATH,
    ENV_CONFIG_PATH,
    config_path,
    exposed,
    load,
)
from nanobot.config.mcp import McpConfig, McpServerConfig
from nanobot.config.people import PeopleConfig
from nanobot.config.store import StoreConfig
from nanobot.config.tools import (
    Approval,
    ApprovalConfig,
    ExecConfig,
    ExecLimitsConfig,
    ToolsConfig,
    WebConfig,
)
from nanobot.config.tree import DEFAULT_DATA_DIR, ENV_PREFIX, Config

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_DATA_DIR",
    "ENV_CONFIG_PATH",
    "ENV_PREFIX",
    "AgentConfig",
    "Approval",
    "ApprovalConfig",
    "BudgetConfig",
    "ChannelConfig",
    "ChannelsConfig",
    "ChatTarget",
    "ClusterConfig",
    "Config",
    "CronConfig",
    "DiscordConfig",
    "ExecConfig",
    "ExecLimitsConfig",
    "GatewayConfig",
    "HeartbeatConfig",
    "LogConfig",
    "McpConfig",
    "McpServerConfig",
    "ModelPrice",
    "PeopleConfig",
    "PersonBudget",
    "StoreConfig",
    "TelegramConfig",
    "TelegramWebhookConfig",
    "ToolsConfig",
    "WebConfig",
    "config_path",
    "exposed",
    "load",
]
