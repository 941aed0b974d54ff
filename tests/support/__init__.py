"""Test helpers shared by the suite (not collected: no test_ prefix)."""
