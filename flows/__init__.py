"""contramine.flows: the Prefect flows (mine.py), the `contramine` CLI (cli.py), `sql` (sql.py), the deployments
(deployments.py) and the environment check (doctor.py)."""
