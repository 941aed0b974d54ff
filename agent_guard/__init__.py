"""edge-agent-guard: the standard-library-only unit that owns the trial of a new agent release (issue 40).

It never imports `agent` (tests/test_guard_stdlib.py checks it) and is never replaced by a release: a broken
release cannot break the code that rolls it back. Layout it owns under the release root (/opt/edge-agent):

    releases/<version>/venv      a side-by-side install (agent.release.install)
    current, previous            symlinks to releases/<version>, replaced by rename (links.flip)
    guard/request.json           a trial asked for by the running agent (`edge-agent release activate`)
    guard/golden.json            each committed model's request and the answer release N served
    guard/trial.json             the trial in progress: the step it reached (a power cut resumes from it)
    guard/tries/<version>        failed tries so far; guard/bad/<version> once a release is marked bad
    guard/reports/*.json         one report per trial (good or failed, with the reason)
"""

GUARD_FORMAT = 1
