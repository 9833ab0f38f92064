"""contramine.flows: the Prefect flows (mine.py), the `contramine` CLI (cli.py; its upkeep commands: upkeep.py),
`sql` (sql.py), the deployments (deployments.py) and the environment check (doctor.py)."""

# One file, one module: this folder is the package `contramine.flows` (contramine/flows links here), never the top-level
# `flows` that a checkout's root on sys.path would also offer (two module objects, two registries)
if __name__ != "contramine.flows":
    raise ImportError(f"import contramine.flows, not {__name__}: this folder is part of the package contramine")
