"""Translation between Chat Completions, Anthropic Messages and Responses (R-XLATE-1..2);
pure and I/O-free except ``channel``, which reads a run through a translator."""
