"""One module per provider kind, all behind the small interface in base.py."""
