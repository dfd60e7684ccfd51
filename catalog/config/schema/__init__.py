"""The typed shape of an Edge config document (pydantic, strict, unknown keys rejected)."""

from catalog.config.schema.base import Doc, issues_from, validate_into
from catalog.config.schema.catalog import (
    AuthDoc,
    ModelDoc,
    NodeDoc,
    PriceDoc,
    ProfileDoc,
    ProviderDoc,
)
from catalog.config.schema.openai import OpenAIDoc, PrincipalDoc
from catalog.config.schema.sections import (
    AdminDoc,
    CredentialPlaneDoc,
    EdgeDoc,
    MeteringDoc,
    ProviderPoolDoc,
)

__all__ = [
    "AdminDoc",
    "AuthDoc",
    "CredentialPlaneDoc",
    "Doc",
    "EdgeDoc",
    "MeteringDoc",
    "ModelDoc",
    "NodeDoc",
    "OpenAIDoc",
    "PriceDoc",
    "PrincipalDoc",
    "ProfileDoc",
    "ProviderDoc",
    "ProviderPoolDoc",
    "issues_from",
    "validate_into",
]
