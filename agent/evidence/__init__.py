"""Signed qualification evidence: in-toto Statements in DSSE envelopes, signed with the device's own key."""
