"""Usage metering: what each request counts as, in Prometheus and in the usage ledger."""

from pool.metering.labels import NO_LABEL, RequestRecord
from pool.metering.meter import UsageMeter, usage_retention_days

__all__ = ["NO_LABEL", "RequestRecord", "UsageMeter", "usage_retention_days"]
