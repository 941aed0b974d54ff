"""Small shared helpers with no project dependencies."""
