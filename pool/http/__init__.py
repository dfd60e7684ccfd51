"""The OpenAI-compatible HTTP surface (the hot path): a plain ASGI app, no Django stack.

``app.OpenAIApp`` routes; ``auth``, ``body``, ``operations`` and ``errors`` are the small
checks every request passes; ``dispatch`` and ``relay`` run it through the pool and a Node.
"""
