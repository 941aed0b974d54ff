"""The control-plane service (`edge-agent control-plane --config FILE`): device registry in a database,
enrollment, HTTP API, dashboard and rollouts run inside the service on agent.fleet's engine."""
