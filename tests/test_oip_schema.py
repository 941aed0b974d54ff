"""schemathesis against the official KServe v2 REST specification (patched fixture, see tests/fixtures/kserve):
no server errors, and every response matches the schema the specification gives it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from oip_proc import served

SPEC = Path(__file__).parent / "fixtures" / "kserve" / "rest_predict_v2.yaml"


def _narrowed() -> dict:
    """The spec with its path parameters narrowed (test-side only) to names this server knows and does not,
    so that generated requests reach the models instead of stopping at 404."""
    doc = copy.deepcopy(yaml.safe_load(SPEC.read_text(encoding="utf-8")))
    for item in doc["paths"].values():
        for p in item.get("parameters", []):
            if p["name"] == "MODEL_NAME":
                p["schema"] = {"type": "string", "enum": ["tiny", "ids", "id32", "nope"]}
            elif p["name"] == "MODEL_VERSION":
                p["schema"] = {"type": "string", "enum": ["1", "2"]}
    return doc


schema = schemathesis.openapi.from_dict(_narrowed())
wide = schemathesis.openapi.from_path(str(SPEC))


@pytest.fixture(scope="module")
def srv():
    with served(max_body_bytes=1 << 20, body_budget_bytes=8 << 20) as s:
        yield s


# positive_data_acceptance is left out: a request the schema accepts is not one the model accepts (a model
# needs its own input names, datatypes and shapes, which the specification cannot state).
CHECKS = dict(excluded_checks=[schemathesis.checks.positive_data_acceptance])


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_kserve_spec_known_models(srv, case):
    case.call_and_validate(base_url=f"http://127.0.0.1:{srv.port}", timeout=30, **CHECKS)


@wide.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_kserve_spec_any_names(srv, case):
    case.call_and_validate(base_url=f"http://127.0.0.1:{srv.port}", timeout=30, **CHECKS)
