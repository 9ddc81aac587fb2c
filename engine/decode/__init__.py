"""The decode loops (plain and speculative) and what they count: draft length, output, stats, token origins."""
