"""Helpers that put sparse_mla in place of another library's kernel, one module per library."""
