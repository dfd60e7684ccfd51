"""Environment variable names a declared secret may not take (R-TLS-3, docs/node.md).

A Node gives a command line program a fixed base environment plus the secret names its
provider declares. A declared name that changes how programs load or what they run
(``LD_PRELOAD``, ``PYTHONPATH``, ``PATH`` itself, ``NODE_OPTIONS``, ``BASH_ENV`` ...) would
let whoever writes the provider, or the slot secret it carries, run code on the Node: such
names are refused, on the Edge at load and on the Node by its policy check.
"""

from __future__ import annotations

import re

__all__ = ["BASE_NAMES", "BASE_PREFIXES", "REFUSED_NAMES", "REFUSED_PREFIXES", "refused_name"]

# What a command sees of the Node's own environment: nothing else of it reaches a program.
BASE_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
     "TERM", "SHELL", "SYSTEMROOT", "COMSPEC", "PATHEXT", "USERPROFILE", "APPDATA", "LOCALAPPDATA"}
)  # fmt: skip
BASE_PREFIXES = ("LC_", "XDG_")

# Names that load code, pick the program or its interpreter's search paths.
REFUSED_NAMES = frozenset(
    {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "GLOBIGNORE",
     "NODE_OPTIONS", "NODE_PATH", "PERL5LIB", "PERL5OPT", "PERLLIB", "PERL5DB",
     "RUBYOPT", "RUBYLIB", "GEM_HOME", "GEM_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
     "JDK_JAVA_OPTIONS", "CLASSPATH", "GCONV_PATH", "LOCPATH", "NLSPATH", "GLIBC_TUNABLES",
     "HOSTALIASES", "RESOLV_HOST_CONF", "SSL_CERT_FILE", "SSL_CERT_DIR", "OPENSSL_CONF",
     "OPENSSL_MODULES", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
     "ALL_PROXY", "NO_PROXY", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH", "GIT_CONFIG",
     "EDITOR", "VISUAL", "PAGER", "BROWSER", "TCL_LIBRARY", "TK_LIBRARY"}
)  # fmt: skip
REFUSED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "LUA_", "NPM_CONFIG_", "MALLOC_")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refused_name(name: str) -> str | None:
    """Why ``name`` may not carry a declared secret to a program, or None when it may."""
    if not _NAME.match(name):
        return f"{name!r} is not an environment variable name"
    upper = name.upper()
    if upper in BASE_NAMES or upper.startswith(BASE_PREFIXES):
        return f"{name} comes from the Node's base environment, never from a secret"
    if upper in REFUSED_NAMES or upper.startswith(REFUSED_PREFIXES):
        return f"{name} changes how programs load or what they run"
    return None
