"""Fallback ``flash_attn.utils`` package (see the parent package's docstring)."""
