"""What the Edge and the Node share to be observed: request context, log lines, trace setup.

Imports nothing of the project and no Django (both sides use it; docs/observability.md).
"""
