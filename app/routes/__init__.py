"""HTTP routes: api.py (JSON and the compact transport), pages.py (the page)."""
