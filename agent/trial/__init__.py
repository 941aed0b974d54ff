"""The trial of a fresh version: shadow before its swap, probation after it, judged against the incumbent."""
