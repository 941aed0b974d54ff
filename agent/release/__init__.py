"""Agent releases as signed artifacts (issue 40): a wheelhouse with a manifest signed by the fleet key
(manifest), built with pip (build), verified and installed side by side under <root>/releases/<version>/venv
(install), and the golden answers the guard's trial compares against (golden). The trial itself is the guard's
(agent_guard, standard library only)."""
