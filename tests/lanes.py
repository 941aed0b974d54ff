"""Which lane each test module runs in (scripts/test.sh runs them one after the other, each timed).

- core (`-m "not field and not system"`): unit tests and one daemon at a time, the fast feedback lane;
- verdicts alone (`-m alone`, marked in the test itself, run with `-n 0` right after the core suite): compute-time
  verdicts judged against an incumbent measured earlier. A second test on the other core slows a shared core
  without any run-queue wait, which the run gate cannot see as contention (measured in CI: a 2x-compute version
  read 1.51x with the other worker busy, and committed);
- system (`-m system`): whole fleets and whole-process faults: the control plane (SQLite, PostgreSQL, a browser),
  rollouts to simulated devices, broker clusters, and daemons killed, cut off, attacked or flooded mid-deployment;
- field (`-m field`, marked in the test itself): the device at field scale (the emulated Pi, ten real models at
  once, the soak under load, OpenVINO's ONNX Runtime plugin). The fleet at field scale (30 devices on the NATS
  cluster with a node killed, the control plane on that cluster) is the system lane's, with the rest of the fleet.

A module listed here that also has field tests keeps those in the field lane. `pytest` alone runs every lane.
"""

from __future__ import annotations

SYSTEM = frozenset(
    {
        # the fleet side: control plane, rollouts, simulated devices, brokers
        "test_brokers_smoke",
        "test_controlplane_nats_cluster",
        "test_controlplane_api",
        "test_controlplane_browser",
        "test_controlplane_dashboard",
        "test_controlplane_config",
        "test_controlplane_daemon",
        "test_controlplane_flood",
        "test_controlplane_knobs",
        "test_controlplane_limits",
        "test_controlplane_service",
        "test_controlplane_web_security",
        "test_controlplane_tls",
        "test_controlplane_browser_attacks",
        "test_controlplane_freshness",
        "test_controlplane_probation",
        "test_controlplane_replicas",
        "test_controlplane_rollback",
        "test_controlplane_unjudged",
        "test_rollout_unjudged",
        "test_cp_scale",
        "test_controlplane_observe",
        "test_controlplane_operator",  # issue 37 done-when: 20 simulated devices run from the browser
        "test_rollout_recall",
        "test_help_examples",  # every --help example against a live daemon, broker and service (8-11 min serial)
        "test_evidence_sim",
        "test_fleet_outcome",
        "test_fleet_push",
        "test_generative_fleet",  # issue 39: a generative package's delta push to a daemon over the broker
        "test_fleet_registry_lock",
        "test_fleet_trust",
        "test_nats_cluster",
        "test_rollout_plan",
        "test_rollout_sim",
        "test_simulator",
        "test_simulate_controlplane",  # `fleet simulate --control-plane`: enroll, accept, evidence on a service
        # whole daemons under faults: killed, cut off, attacked, flooded
        "test_daemon_crash",
        "test_daemon_mqtt_crash",
        "test_delta_crash",
        "test_mqtt_attacks",
        "test_mqtt_flood",
        "test_mqtt_outages",
        "test_mqtt_rollback_inflight",
        "test_oip_slowloris",
        "test_self_update",  # releases of the agent trialled by edge-agent-guard: whole daemons crashed and killed
        "test_release_rollout",  # kind: agent rollouts to 20 simulated devices on a service; release uploads
        "test_release_cp_device",  # a real daemon under edge-agent-guard takes a release from the service
    }
)
