"""An Environment's resource usage as its node last sampled it (MET-1). HTTP: camelCase."""

from __future__ import annotations

from pydantic import Field

from adx.model._base import ApiModel


class EnvironmentStats(ApiModel):
    """Usage of the running execution, from the node's periodic sample (or one taken on request).

    ``cpuPercent`` is the share of the Environment's CPU limit used between the last two samples (``None``
    until there are two); ``sampleAgeSeconds`` says how old the reading is when it is served."""

    environment_id: str
    execution_id: str
    generation: int = Field(ge=0)
    node: str
    sampled_at: float = Field(description="Unix time of the reading")
    sample_age_seconds: float = Field(ge=0)
    cpu_limit_cores: float = Field(ge=0, description="the Environment's CPU limit (0: none)")
    cpu_usage_seconds: float = Field(ge=0, description="CPU time used by the execution so far")
    cpu_percent: float | None = Field(default=None, ge=0)
    memory_bytes: int = Field(ge=0)
    memory_peak_bytes: int = Field(ge=0)
    memory_cache_bytes: int = Field(ge=0, description="page cache, part of memoryBytes")
    memory_limit_bytes: int = Field(ge=0, description="0: none")
    disk_bytes: int = Field(ge=0, description="bytes in the writable layer")
    disk_limit_bytes: int = Field(ge=0, description="0: none")
    pids: int = Field(ge=0)
    oom_kills: int = Field(ge=0)
