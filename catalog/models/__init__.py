"""The catalog tables: what operators edit. The running config is a snapshot built from them.

Each table keeps the document keys worth a column (for search, filters and forms) and a JSON
`settings` column for every other key, so a document survives import/export unchanged.
Blank/NULL columns mean "absent from the document" (the loader applies its defaults).
"""

from catalog.models.base import DocumentJSONField, OrderedRow, is_absent, settings_problem
from catalog.models.credentials import CredentialSlot, Route, RouteSlot
from catalog.models.edge import EdgeSettings
from catalog.models.tables import (
    MINT_HELP,
    NODE_TOKEN_HELP,
    ModelGroup,
    ModelProvider,
    Node,
    PrincipalToken,
    ProtocolProfile,
    Provider,
)

__all__ = [
    "MINT_HELP",
    "NODE_TOKEN_HELP",
    "CredentialSlot",
    "DocumentJSONField",
    "EdgeSettings",
    "ModelGroup",
    "ModelProvider",
    "Node",
    "OrderedRow",
    "PrincipalToken",
    "ProtocolProfile",
    "Provider",
    "Route",
    "RouteSlot",
    "is_absent",
    "settings_problem",
]
