"""The central stack's services that both the static compose checks and the live compose test name."""

# the pipeline's services of docker-compose.yml: the live test starts them, the static test checks them
# (each adds its own: alertmanager is started live, grafana is checked statically by its provisioning)
CENTRAL_CORE_SERVICES = (
    "kafka",
    "kafka-init",
    "spark-master",
    "spark-worker",
    "job",
    "api",
    "prometheus",
)
