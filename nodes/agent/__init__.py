"""The IOP Node agent: dials out to the Edge and runs providers' requests (no Django)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("iop-edge")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"
