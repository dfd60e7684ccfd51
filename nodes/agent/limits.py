"""What a Node buffers and how long a command may run (R-TLS-4; node.yaml ``limits``,
defaults in docs/node.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MiB = 1024 * 1024


class Limits(BaseModel):
    """Byte caps on what is buffered from upstreams and commands, and the default CLI run
    timeout (a provider's own ``run_timeout_s`` wins)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: Annotated[int, Field(strict=True, ge=1024)] = 64 * MiB
    max_line_bytes: Annotated[int, Field(strict=True, ge=1024)] = 1 * MiB
    cli_max_output_bytes: Annotated[int, Field(strict=True, ge=1024)] = 16 * MiB
    cli_run_timeout_s: Annotated[float, Field(gt=0)] = 600.0


DEFAULT_LIMITS = Limits()
