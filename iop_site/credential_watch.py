"""The managed route table follows changes made outside this process (R-MGD-12): every
``IOP_REVISION_POLL_S`` (default 1 s) a worker thread compares the route and slot rows'
version with the table's and rebuilds the table when they differ, or while a slot names a
key id the table's keyring lacks (the keyring file is then read again: putting the right
file in place heals the Edge without a restart). ``iop_slot set``,
``iop_route create``/``delete``, ``iop_keyring rotate`` and a change on another Edge are
therefore used within one poll interval plus the rebuild; a change in this Edge's admin is
used at once (``catalog.credential_signals``). docs/credentials.md.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from catalog.route_reader import refresh_route_table
from iop_site.companion import TaskCompanion
from pool.http.managed import ManagedKeys

log = logging.getLogger("iop.http")


class CredentialWatcher(TaskCompanion):
    """Polls the route/slot version and swaps in a rebuilt table (a runtime companion)."""

    task_name = "credential-watcher"

    def __init__(self, keys: ManagedKeys, *, poll_s: float) -> None:
        super().__init__()
        self.keys = keys
        self.poll_s = poll_s
        self._refresh = database_sync_to_async(lambda: refresh_route_table(keys))

    async def _first(self) -> None:
        await self._refresh()  # the table is current before the Edge says it is ready

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                if await self._refresh():
                    log.info("route table rebuilt: %s", self.keys.table.status())
            except Exception as exc:  # a database hiccup: the table in force stays
                log.warning("cannot read the routes and slots: %s", type(exc).__name__)
