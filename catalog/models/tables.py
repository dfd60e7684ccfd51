"""Catalog tables: profiles, Nodes, providers, model groups and principal token hashes."""

from __future__ import annotations

from django.db import models

from catalog.models.base import DocumentJSONField, OrderedRow

MINT_HELP = (
    "sha256 hex of the raw token; the raw token is never stored. Mint one with "
    "`python manage.py iop_token --principal TOKEN_REF --principal-ref REF`."
)
NODE_TOKEN_HELP = (
    "sha256 hex of the Node's token; the raw token is never stored. Mint one with "
    "`python manage.py iop_token --node NODE_ID`."
)

PRICE_HELP = (
    "metering.currency per million tokens (R-COST-1, live), e.g. "
    '{"input": 0.15, "output": 0.6, "cached_input": 0.075}; cached_input blank = the input '
    "price. A provider's price wins over its model group's. Blank = none."
)


class ProtocolProfile(OrderedRow):
    """A custom protocol profile overlay (`protocol_profiles.<name>`, R-PROF-1)."""

    name = models.CharField(max_length=100, unique=True)
    base = models.CharField(max_length=100, blank=True, help_text="Profile it inherits from.")
    driver = models.CharField(max_length=50, blank=True)
    base_url = models.CharField(max_length=500, blank=True)

    columns = {"base": "base", "driver": "driver", "base_url": "base_url"}

    class Meta:
        ordering = ("order", "pk")

    def __str__(self) -> str:
        return self.name


class Node(OrderedRow):
    """A Node (`nodes[]`): a machine that dials in and hosts providers."""

    key = models.CharField("id", max_length=100, unique=True)
    alias = models.CharField(max_length=200, blank=True)
    token_hash_sha256 = models.CharField(max_length=64, blank=True, help_text=NODE_TOKEN_HELP)

    columns = {"id": "key", "alias": "alias", "token_hash_sha256": "token_hash_sha256"}
    child_keys = frozenset({"providers"})

    class Meta:
        ordering = ("order", "pk")

    def __str__(self) -> str:
        return self.key


class Provider(OrderedRow):
    """A provider on a Node (`nodes[].providers[]`); its id is unique in the config (R-CFG-3)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="providers")
    key = models.CharField("id", max_length=100, unique=True)
    profile = models.CharField(max_length=100, blank=True, help_text="Profile selector.")
    legacy_type = models.CharField(
        "type (legacy)", max_length=100, blank=True, help_text="Legacy type alias of a profile."
    )
    capacity = models.IntegerField(null=True, blank=True, default=1)
    long_context_capacity = models.IntegerField(null=True, blank=True)
    context_window_tokens = models.IntegerField(null=True, blank=True)
    priority = models.IntegerField(null=True, blank=True, help_text="Lower is preferred.")
    enabled = models.BooleanField(default=True)
    price = DocumentJSONField(null=True, blank=True, help_text=PRICE_HELP)

    columns = {
        "id": "key",
        "profile": "profile",
        "type": "legacy_type",
        "capacity": "capacity",
        "long_context_capacity": "long_context_capacity",
        "context_window_tokens": "context_window_tokens",
        "priority": "priority",
        "enabled": "enabled",
        "price": "price",
    }

    class Meta:
        ordering = ("node__order", "node__pk", "order", "pk")

    def siblings(self) -> models.QuerySet:
        return Provider.objects.filter(node_id=self.node_id)

    def __str__(self) -> str:
        return self.key


class ModelGroup(OrderedRow):
    """A model group (`models[]`): the external `model` key (R-CFG-1)."""

    USAGE_CHOICES = (("provider", "provider"), ("model_group", "model_group"))

    key = models.CharField("id", max_length=200, unique=True)
    usage_attribution = models.CharField(
        max_length=20, blank=True, choices=USAGE_CHOICES, help_text="Blank means provider."
    )

    fallbacks = DocumentJSONField(
        null=True,
        blank=True,
        help_text=(
            "Model group ids tried in order when this one cannot serve (R-FALL-1, live); "
            'e.g. ["backup"]. Blank = none.'
        ),
    )

    price = DocumentJSONField(null=True, blank=True, help_text=PRICE_HELP)

    columns = {
        "id": "key",
        "usage_attribution": "usage_attribution",
        "fallbacks": "fallbacks",
        "price": "price",
    }
    child_keys = frozenset({"providers"})

    class Meta:
        ordering = ("order", "pk")

    def __str__(self) -> str:
        return self.key


class ModelProvider(models.Model):
    """One `models[].providers` entry: provider id -> served model name (R-CFG-2)."""

    model_group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="targets")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="targets")
    served_model = models.CharField(max_length=300)
    order = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ("order", "pk")
        constraints = [
            models.UniqueConstraint(
                fields=["model_group", "provider"], name="catalog_model_provider_once"
            )
        ]

    def save(self, *args, **kwargs) -> None:
        if self.order is None:
            siblings = ModelProvider.objects.filter(model_group_id=self.model_group_id)
            last = siblings.aggregate(last=models.Max("order"))["last"]
            self.order = 0 if last is None else last + 1
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        return f"{self.provider} -> {self.served_model}"


LIMIT_HELP = "Blank = no limit. Live: a lower limit never cancels running requests."


class PrincipalToken(OrderedRow):
    """A caller token hash (`openai.principal_tokens[]`, R-CFG-12) and its policy (R-PRIN-1..3).

    Never a raw token.
    """

    token_ref = models.CharField(max_length=200, unique=True)
    token_hash_sha256 = models.CharField(max_length=64, unique=True, help_text=MINT_HELP)
    principal_ref = models.CharField(max_length=200)
    alias = models.CharField(max_length=200, blank=True)
    model_groups = DocumentJSONField(
        "models",
        null=True,
        blank=True,
        help_text="Model group ids this token may call (R-PRIN-1); none = every group.",
    )
    max_in_flight = models.IntegerField(null=True, blank=True, help_text=LIMIT_HELP)
    rpm = models.IntegerField("requests per minute", null=True, blank=True, help_text=LIMIT_HELP)
    tpm = models.IntegerField("tokens per minute", null=True, blank=True, help_text=LIMIT_HELP)
    max_queued = models.IntegerField(
        null=True,
        blank=True,
        help_text="Waiters this token may hold in the queue; blank = no share limit.",
    )
    budget = DocumentJSONField(
        null=True,
        blank=True,
        help_text=(
            "The principal's tokens or amount of metering.currency per UTC calendar period "
            '(R-BUD-1, R-COST-3, live), e.g. {"tokens": 5000000, "period": "month"} or '
            '{"amount": 25.0, "period": "month"} (day, week or month). A budget is the '
            "principal's: state it on one of its tokens and it holds for all of them (another "
            "of its tokens may only repeat it unchanged). Blank = no budget of its own."
        ),
    )

    columns = {
        "token_ref": "token_ref",
        "token_hash_sha256": "token_hash_sha256",
        "principal_ref": "principal_ref",
        "alias": "alias",
        "models": "model_groups",
        "max_in_flight": "max_in_flight",
        "rpm": "rpm",
        "tpm": "tpm",
        "max_queued": "max_queued",
        "budget": "budget",
    }

    class Meta:
        ordering = ("order", "pk")

    def __str__(self) -> str:
        return self.token_ref
