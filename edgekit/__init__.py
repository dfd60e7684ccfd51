"""Small seams shared by every listener and app of the Edge (docs/architecture.md).

``edgekit.http`` owns JSON replies, the error body, bounded body reads and the loopback
check; ``edgekit.running`` is the handle Django views use to reach the Edge running in this
process. Nothing here imports Django or an app, so every package may import it.
"""
